package qemuvm

import (
	_ "kiln/deploy/lab/testkit"
)
