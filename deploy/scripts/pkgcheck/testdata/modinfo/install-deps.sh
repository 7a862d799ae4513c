#!/bin/sh
# fixture install-deps: installs iproute2 only (kmod forgotten)
echo iproute2
