package agent

import (
	"fmt"
	"net"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// In-band BMC address: Get LAN Configuration Parameters (IPMI 2.0 §23.2, NetFn Transport
// 0Ch, command 02h), parameter 3 "IP Address", sent through the kernel's IPMI message
// handler (/dev/ipmi0, linux/ipmi.h IPMICTL_SEND_COMMAND / IPMICTL_RECEIVE_MSG_TRUNC) to the
// system interface (KCS/BT/SSIF, modules ipmi_si + ipmi_devintf). LAN channels 1..11 are
// tried in turn; the first non-zero address wins. No BMC, no driver or no answer → "".

type ipmiSysAddr struct {
	addrType int32
	channel  int16
	lun      uint8
	_        uint8
}

type ipmiMsg struct {
	netfn   uint8
	cmd     uint8
	dataLen uint16
	_       uint32
	data    uintptr
}

type ipmiReq struct {
	addr    uintptr
	addrLen uint32
	_       uint32
	msgid   int64
	msg     ipmiMsg
}

type ipmiRecv struct {
	recvType int32
	_        uint32
	addr     uintptr
	addrLen  uint32
	_        uint32
	msgid    int64
	msg      ipmiMsg
}

const (
	ipmiSystemInterfaceAddrType = 0x0c
	ipmiBMCChannel              = 0x0f
	ipmictlSendCommand          = 0x8028690D // _IOR('i', 13, struct ipmi_req)
	ipmictlReceiveMsgTrunc      = 0xC030690B // _IOWR('i', 11, struct ipmi_recv)
)

// BMCAddress returns the BMC's IPv4 LAN address seen in-band; an error says why it is not
// visible (no device, no answer, no LAN channel with an address).
func BMCAddress(dev string, timeout time.Duration) (string, error) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	last := fmt.Errorf("no LAN channel with an IPv4 address")
	for ch := byte(1); ch <= 11; ch++ {
		resp, err := ipmiCall(f, int64(ch), 0x0C, 0x02, []byte{ch, 3, 0, 0}, timeout)
		if err != nil {
			last = fmt.Errorf("channel %d: %w", ch, err)
			if ch == 1 {
				return "", last // the BMC does not answer at all
			}
			continue
		}
		if ip := parseLANIPResponse(resp); ip != "" {
			return ip, nil
		}
		if ch == 1 || (len(resp) > 0 && resp[0] != 0xCB && resp[0] != 0xCC) {
			last = fmt.Errorf("channel %d: response % x", ch, resp) // keep the most telling answer
		}
	}
	return "", last
}

// parseLANIPResponse reads [completion code, parameter revision, a, b, c, d].
func parseLANIPResponse(b []byte) string {
	if len(b) < 6 || b[0] != 0 {
		return ""
	}
	ip := net.IPv4(b[2], b[3], b[4], b[5])
	if ip.IsUnspecified() {
		return ""
	}
	return ip.String()
}

// ipmiCall sends one request with message id msgid and waits for its answer.
func ipmiCall(f *os.File, msgid int64, netfn, cmd byte, data []byte, timeout time.Duration) ([]byte, error) {
	addr := ipmiSysAddr{addrType: ipmiSystemInterfaceAddrType, channel: ipmiBMCChannel}
	req := ipmiReq{addr: uintptr(unsafe.Pointer(&addr)), addrLen: uint32(unsafe.Sizeof(addr)), msgid: msgid,
		msg: ipmiMsg{netfn: netfn, cmd: cmd, dataLen: uint16(len(data)), data: uintptr(unsafe.Pointer(&data[0]))}}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ipmictlSendCommand, uintptr(unsafe.Pointer(&req))); e != 0 {
		return nil, e
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("ipmi: no response")
		}
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && err != unix.EINTR {
			return nil, err
		} else if n == 0 {
			continue
		}
		buf := make([]byte, 64)
		var raddr ipmiSysAddr
		rcv := ipmiRecv{addr: uintptr(unsafe.Pointer(&raddr)), addrLen: uint32(unsafe.Sizeof(raddr)),
			msg: ipmiMsg{dataLen: uint16(len(buf)), data: uintptr(unsafe.Pointer(&buf[0]))}}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ipmictlReceiveMsgTrunc, uintptr(unsafe.Pointer(&rcv)))
		if e != 0 && e != unix.EMSGSIZE {
			return nil, e
		}
		if rcv.msgid != msgid {
			continue // a stale answer to an earlier request
		}
		return buf[:rcv.msg.dataLen], nil
	}
}
