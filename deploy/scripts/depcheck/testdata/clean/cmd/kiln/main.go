package main

import (
	_ "kiln/api"
	_ "kiln/api/client"
	_ "kiln/appliance"
)
