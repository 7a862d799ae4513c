package vbmc_test

import (
	_ "kiln/bmc"
	_ "kiln/deploy/lab/vbmc"
)
