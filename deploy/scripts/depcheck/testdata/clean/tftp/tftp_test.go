package tftp

import (
	_ "kiln/deploy/lab/qemuvm"
)
