package main

import (
	_ "os"
)
