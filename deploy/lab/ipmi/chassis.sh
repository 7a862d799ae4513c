#!/bin/sh
# Kiln lab: ipmi_sim "chassis_control" program driving one qemu VM.
#
# ipmi_sim runs:   chassis.sh STATEDIR get power|boot ...
#                  chassis.sh STATEDIR set power 0|1 | reset 1 | boot none|pxe|default|cdrom|bios | shutdown 1 | identify I F
#                  chassis.sh STATEDIR check
# "get" prints one "name:value" line per parameter.
#
# STATEDIR holds:  qemu.args   the VM's command line, one argument per line (input; no -qmp/-serial/-boot)
#                  boot        pending boot device (one-time: cleared when a start consumes it)
#                  qemu.pid    pid of the running VM
#                  boots.log   one line per start: "N pid boot=DEV args..."
#                  qmp-N.sock  QMP socket of start N;  serial-N.log  its serial console
#                  chassis.log every call, for tests
#
# ipmi_sim calls this synchronously and ipmitool retransmits after ~1 s, so every
# branch returns at once: qemu is started detached, and stopping is TERM now, KILL later.
set -u
D=$1; shift
op=${1:-}; [ $# -gt 0 ] && shift
echo "$(date +%s.%N) $op $*" >> "$D/chassis.log"

alive() { # pid is a live (not zombie) process
	[ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
	st=$(sed 's/^.*) //' "/proc/$1/stat" | cut -d' ' -f1)
	[ "$st" != Z ]
}
vm_pid() { cat "$D/qemu.pid" 2>/dev/null; }
running() { alive "$(vm_pid)"; }

vm_on() {
	running && return 0
	n=$(( $(wc -l < "$D/boots.log" 2>/dev/null || echo 0) + 1 ))
	dev=$(cat "$D/boot" 2>/dev/null || echo none)
	rm -f "$D/boot"   # IPMI boot flags without "persistent" apply to the next boot only
	set --
	while IFS= read -r a; do [ -n "$a" ] && set -- "$@" "$a"; done < "$D/qemu.args"
	set -- "$@" -qmp "unix:$D/qmp-$n.sock,server=on,wait=off" -serial "file:$D/serial-$n.log"
	case $dev in
		pxe) set -- "$@" -boot once=n ;;
		default) set -- "$@" -boot once=c ;;
		cdrom) set -- "$@" -boot once=d ;;
	esac
	setsid "$@" < /dev/null >> "$D/qemu.log" 2>&1 &
	pid=$!
	echo "$pid" > "$D/qemu.pid"
	echo "$n $pid boot=$dev $*" >> "$D/boots.log"
}

vm_off() {
	pid=$(vm_pid); rm -f "$D/qemu.pid"
	alive "$pid" || return 0
	kill -TERM "$pid" 2>/dev/null
	( i=0; while [ $i -lt 50 ] && alive "$pid"; do sleep 0.1; i=$((i+1)); done
	  alive "$pid" && kill -KILL "$pid" 2>/dev/null ) < /dev/null > /dev/null 2>&1 &
	return 0
}

case $op in
get)
	for p in "$@"; do
		case $p in
			power) if running; then echo power:1; else echo power:0; fi ;;
			boot) echo "boot:$(cat "$D/boot" 2>/dev/null || echo none)" ;;
			*) echo "unknown parameter $p" >&2; exit 1 ;;
		esac
	done ;;
set)
	while [ $# -ge 2 ]; do
		p=$1; v=$2; shift 2
		case $p in
			power) if [ "$v" = 1 ]; then vm_on; else vm_off; fi ;;
			reset) vm_off; vm_on ;;
			shutdown) vm_off ;;
			boot) case $v in
				none|pxe|default|cdrom|bios) echo "$v" > "$D/boot" ;;
				*) echo "bad boot device $v" >&2; exit 1 ;;
			      esac ;;
			identify) [ $# -ge 1 ] && shift ;;
			*) echo "unknown parameter $p" >&2; exit 1 ;;
		esac
	done ;;
check) exit 1 ;;
*) echo "unknown operation $op" >&2; exit 1 ;;
esac
exit 0
