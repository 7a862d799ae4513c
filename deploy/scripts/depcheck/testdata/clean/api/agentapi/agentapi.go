package agentapi
