package fleet

import (
	"io"
	"net"
	"sync"
	"time"
)

// Outage is a TCP proxy in front of the API server through which every
// agent and the coordinator connect. Cut plays an API server outage as the
// clients see it: every connection (watches included) drops, and new ones
// are refused until it ends. TLS passes through untouched.
type Outage struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	until time.Time
	conns map[net.Conn]bool
}

// NewOutage listens on a free loopback port and forwards to target (host:port).
func NewOutage(target string) (*Outage, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	o := &Outage{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go o.serve()
	return o, nil
}

// Addr is the proxy's host:port.
func (o *Outage) Addr() string { return o.ln.Addr().String() }

// Close stops the proxy and drops every connection.
func (o *Outage) Close() {
	_ = o.ln.Close()
	o.dropAll()
}

// Cut drops every connection and refuses new ones for d.
func (o *Outage) Cut(d time.Duration) {
	o.mu.Lock()
	// Overlapping cuts (seeds sharing a fleet) end with the later one.
	if end := time.Now().Add(d); end.After(o.until) {
		o.until = end
	}
	o.mu.Unlock()
	o.dropAll()
}

func (o *Outage) down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return time.Now().Before(o.until)
}

func (o *Outage) dropAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for c := range o.conns {
		_ = c.Close()
	}
}

func (o *Outage) track(c net.Conn, on bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if on {
		o.conns[c] = true
	} else {
		delete(o.conns, c)
	}
}

func (o *Outage) serve() {
	for {
		c, err := o.ln.Accept()
		if err != nil {
			return
		}
		if o.down() {
			_ = c.Close()
			continue
		}
		go o.pipe(c)
	}
}

func (o *Outage) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", o.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	o.track(c, true)
	o.track(up, true)
	defer func() {
		o.track(c, false)
		o.track(up, false)
		_ = c.Close()
		_ = up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
