package client

import (
	_ "kiln/api/agentapi"
)
