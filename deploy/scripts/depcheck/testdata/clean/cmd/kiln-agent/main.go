package main

import (
	_ "kiln/api/agentapi"
	_ "kiln/cmd/kiln-agent/agent"
)
