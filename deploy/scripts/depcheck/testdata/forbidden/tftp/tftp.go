package tftp
