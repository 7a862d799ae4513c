package bmc
