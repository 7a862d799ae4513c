#!/bin/sh
# fixture install-deps that installs kmod
echo iproute2
echo kmod
