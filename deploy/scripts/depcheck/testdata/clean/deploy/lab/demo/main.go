package main

import (
	_ "kiln/deploy/lab/e2e"
)
