package devdb

import (
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// HoldCommand is the command a test sends through the proxy to hold back, on the command's $db, every later
// command of the name it gives, as a server building a large index holds createIndexes: {devdbHold:
// "createIndexes", $db: "orders"}. Each such command then waits in the proxy, before its database's mutex
// (so the database's other commands still run), until {devdbHold: "", $db: "orders"} releases every held
// command; they then run as usual. The proxy answers both itself with {ok: 1, waiting: <commands held
// now>}, so a test polls the first form to see that a command arrived (sending it again changes nothing).
const HoldCommand = "devdbHold"

// hold is a database's held command name and the commands waiting on it. The zero value holds nothing.
type hold struct {
	mu      sync.Mutex
	name    string        // the command name held; "" none
	release chan struct{} // closed when the hold is released
	waiting int           // commands waiting on release
}

// set answers a HoldCommand: it holds the command named by m's first value, or releases every held command
// when that is "".
func (h *hold) set(m *message) ([]byte, error) {
	name, _ := m.body.Index(0).Value().StringValueOK()
	h.mu.Lock()
	if name != h.name {
		if h.release != nil {
			close(h.release)
		}
		h.name, h.release, h.waiting = name, nil, 0
		if name != "" {
			h.release = make(chan struct{})
		}
	}
	waiting := h.waiting
	h.mu.Unlock()
	return replyMsg(m.requestID, bson.D{{Key: "waiting", Value: int32(waiting)}, {Key: "ok", Value: 1.0}})
}

// wait blocks while a command called name is held.
func (h *hold) wait(name string) {
	h.mu.Lock()
	if h.name == "" || name != h.name {
		h.mu.Unlock()
		return
	}
	release := h.release
	h.waiting++
	h.mu.Unlock()
	<-release
}

// holdOf returns db's hold, creating it on first use.
func (p *Proxy) holdOf(db *database) *hold {
	if h, ok := p.holds.Load(db); ok {
		return h.(*hold)
	}
	h, _ := p.holds.LoadOrStore(db, new(hold))
	return h.(*hold)
}
