// The agent shares only the agent API's wire types.
package main

import (
	_ "kiln/store"
)
