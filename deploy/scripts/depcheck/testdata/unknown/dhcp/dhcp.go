package dhcp
