package testkit

import (
	_ "testing"
)
