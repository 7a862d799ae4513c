#!/bin/sh
# A build step as deploy/env/build.sh had it: modinfo comes from kmod.
deps=$(/sbin/modinfo -F depends "$1")
echo "$deps" | tr ',' ' '
