// cmd reaches protocol packages only through appliance.
package main

import (
	_ "kiln/dhcp"
)
