package agent

import (
	_ "kiln/api/agentapi"
)
