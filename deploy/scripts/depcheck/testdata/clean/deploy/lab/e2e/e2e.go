package e2e

import (
	_ "kiln/api"
	_ "kiln/api/client"
	_ "kiln/deploy/lab/qemuvm"
)
