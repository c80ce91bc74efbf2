// The server's live events (GET /v1/locks/{lock}/events, GET /v1/events) as typed
// values: an EventStream reads the Server-Sent Events, reconnects by itself and resumes
// with Last-Event-ID (the rules of the Python client's _events.py).
//
// A stream reconnects when its connection drops or goes quiet (the server sends a
// keep-alive comment every 15 s; nothing for 45 s counts as a dead connection), sending
// the id of the last event it delivered, so that nothing is skipped or repeated while the
// server still holds what followed. When the server no longer holds it (more than
// --events-buffer events passed, it restarted, or the stream failed over to another node)
// the first event is a *ResetEvent: read the state again. Each connection goes through
// the client's endpoints like any read. Failures that may pass (the network, 429 too many
// streams, 503) are retried after a pause (0.1 s, doubling to 5 s; LastError keeps the
// last one); a refusal that retrying will not change (401, 403, 400, 404) ends the stream
// and Next returns it. A line longer than 1 MiB, and an event whose data adds up past it,
// is dropped whole rather than accumulated.

package palisade

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

const (
	// eventsIdleLimit: a connection silent this long is dead (keep-alives come every 15 s).
	eventsIdleLimit = 45 * time.Second
	// maxEventLine is the longest line, and the longest event data, a stream keeps.
	maxEventLine               = 1 << 20
	firstPause, maxPause       = 100 * time.Millisecond, 5 * time.Second
	eventStreamReadBufferBytes = 64 << 10
)

// ErrStreamClosed is what Next answers once the stream was closed.
var ErrStreamClosed = errors.New("palisade: events stream closed")

// EventMeta is what every event carries: its id (increasing from event to event; resume
// after it) and the server's wall clock when it was published (ms since the Unix epoch).
type EventMeta struct {
	ID   uint64 `json:"id"`
	AtMs uint64 `json:"at_ms"`
}

// Meta answers the event's id and time.
func (m EventMeta) Meta() EventMeta { return m }

// Event is one event of a stream: *GrantedEvent, *ReleasedEvent, *ExpiredEvent,
// *FencedEvent, *RejectedEvent or *ResetEvent (a type switch tells them apart). Types
// this version does not know are skipped.
type Event interface {
	Meta() EventMeta
}

// GrantedEvent: a lease was granted; Holder got Epoch for TTLMs.
type GrantedEvent struct {
	EventMeta
	Lock   string `json:"lock"`
	Epoch  uint64 `json:"epoch"`
	Holder string `json:"holder"`
	TTLMs  uint64 `json:"ttl_ms"`
}

// ReleasedEvent: the lease of Epoch ended by release (Cause "release"; "unknown" for a
// lease that ended through another etcd node).
type ReleasedEvent struct {
	EventMeta
	Lock   string `json:"lock"`
	Epoch  uint64 `json:"epoch"`
	Holder string `json:"holder"`
	Cause  string `json:"cause"`
}

// ExpiredEvent: the lease of Epoch ran out without renewal.
type ExpiredEvent struct {
	EventMeta
	Lock   string `json:"lock"`
	Epoch  uint64 `json:"epoch"`
	Holder string `json:"holder"`
}

// FencedEvent: the namespace's mark advanced to HighWater (and Seq with the sequence
// policy; 0 otherwise).
type FencedEvent struct {
	EventMeta
	Lock      string `json:"lock"`
	HighWater uint64 `json:"high_water"`
	Seq       uint64 `json:"seq"`
}

// RejectedEvent: a mutation of the namespace was refused with Code. Epoch is the token's
// (nil when none verified), HighWater the mark that refused it (nil unless stale_token or
// stale_sequence).
type RejectedEvent struct {
	EventMeta
	Lock      string  `json:"lock"`
	Code      string  `json:"code"`
	Epoch     *uint64 `json:"epoch"`
	HighWater *uint64 `json:"high_water"`
}

// ResetEvent: events may be missing (Reason unknown_last_event_id, lagged or gap): read
// the state again.
type ResetEvent struct {
	EventMeta
	Reason string `json:"reason"`
}

// parseEvent is the event an SSE data field carries; nil for a type this version does
// not know, or data that is not an event (skipped, as docs/api.md asks).
func parseEvent(data []byte) Event {
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) != nil {
		return nil
	}
	var event Event
	required := []string{"id", "at_ms"}
	switch head.Type {
	case "granted":
		event, required = &GrantedEvent{}, append(required, "lock", "epoch", "holder", "ttl_ms")
	case "released":
		event, required = &ReleasedEvent{}, append(required, "lock", "epoch", "holder", "cause")
	case "expired":
		event, required = &ExpiredEvent{}, append(required, "lock", "epoch", "holder")
	case "fenced":
		event, required = &FencedEvent{}, append(required, "lock", "high_water", "seq")
	case "rejected":
		event, required = &RejectedEvent{}, append(required, "lock", "code")
	case "reset":
		event, required = &ResetEvent{}, append(required, "reason")
	default:
		return nil
	}
	if decode(http.StatusOK, data, event, required) != nil {
		return nil
	}
	return event
}

// sseParser splits a text/event-stream into events' data; comments and fields other
// than data are ignored.
type sseParser struct {
	data      []byte
	hasData   bool
	oversized bool
}

// line takes one line (without its end); it answers an event's data at a blank line.
func (p *sseParser) line(line []byte) ([]byte, bool) {
	if len(line) == 0 {
		data, ok := p.data, p.hasData && !p.oversized
		p.data, p.hasData, p.oversized = nil, false, false
		return data, ok
	}
	if line[0] == ':' {
		return nil, false
	}
	field, value, _ := bytes.Cut(line, []byte(":"))
	if string(field) != "data" {
		return nil, false
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	if p.hasData {
		p.data = append(p.data, '\n')
	}
	p.hasData = true
	if len(p.data)+len(value) > maxEventLine {
		p.data, p.oversized = nil, true
	} else if !p.oversized {
		p.data = append(p.data, value...)
	}
	return nil, false
}

// readLine reads one line of at most max bytes (without its "\n" or "\r\n"); a longer
// one is read to its end and answered as too long, never accumulated.
func readLine(r *bufio.Reader, max int) ([]byte, bool, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLong && len(line)+len(chunk) <= max+2 {
			line = append(line, chunk...)
		} else {
			tooLong, line = true, nil
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		return line, tooLong || len(line) > max, nil
	}
}

// idleReader cancels its connection when a read waits longer than limit.
type idleReader struct {
	r      io.Reader
	limit  time.Duration
	cancel func()
}

func (i idleReader) Read(p []byte) (int, error) {
	timer := time.AfterFunc(i.limit, i.cancel)
	defer timer.Stop()
	return i.r.Read(p)
}

// EventStream reads one events stream; Next answers its events in order. Nothing is sent
// until the first Next (or Connect). Close it when done: its goroutine and connection end
// with it. Safe for concurrent use, though events go to one reader at a time.
type EventStream struct {
	client    *Client
	path      string
	onConnect func()

	mu          sync.Mutex
	resumeAfter *uint64
	lastID      *uint64
	lastErr     error
	connections int
	connected   bool
	err         error

	events    chan Event
	dead      chan struct{}
	up        chan struct{}
	upOnce    sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	startOnce sync.Once
	started   bool
	done      chan struct{}
}

func (c *Client) stream(path string) *EventStream {
	ctx, cancel := context.WithCancel(context.Background())
	return &EventStream{
		client: c, path: path, events: make(chan Event), dead: make(chan struct{}),
		up: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
}

// Watch is the events stream of one lock (GET /v1/locks/{lock}/events): its grants,
// releases, expiries, mark advances and refusals. A name that cannot be sent makes the
// first Next fail with ErrUnsendablePath.
func (c *Client) Watch(lock string) *EventStream {
	name, err := segment("lock name", lock)
	s := c.stream("/v1/locks/" + name + "/events")
	if err != nil {
		s.fail(err)
	}
	return s
}

// Events is the events stream of every lock whose name starts with prefix (every lock
// the caller may see when it is empty): GET /v1/events?prefix=.
func (c *Client) Events(prefix string) *EventStream {
	path := "/v1/events"
	if prefix != "" {
		path += "?" + url.Values{"prefix": {prefix}}.Encode()
	}
	return c.stream(path)
}

// ResumeAfter makes the stream start after event id (a LastEventID of an earlier stream):
// the events the server still holds after it come first, or a *ResetEvent when it holds
// them no longer. Call it before the first Next.
func (s *EventStream) ResumeAfter(id uint64) *EventStream {
	s.mu.Lock()
	s.resumeAfter = &id
	s.mu.Unlock()
	return s
}

// LastEventID is the id of the last event Next answered (ok false before the first).
func (s *EventStream) LastEventID() (id uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastID == nil {
		return 0, false
	}
	return *s.lastID, true
}

// LastError is the last failure the stream retried (nil if none).
func (s *EventStream) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// Connections is how many connections the stream has opened (1 + reconnections).
func (s *EventStream) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connections
}

// Streaming says whether a connection is open now.
func (s *EventStream) Streaming() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected && s.err == nil && s.ctx.Err() == nil
}

func (s *EventStream) start() {
	s.startOnce.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err != nil {
			return // refused before anything is sent (a name that cannot be sent)
		}
		s.started = true
		go s.pump()
	})
}

// Connect opens the stream now (Next opens it otherwise), so that every event after it
// returns reaches the stream. It waits until a connection is open, the stream is refused
// for good (that error), or ctx ends (its error, joined with the last failure retried).
func (s *EventStream) Connect(ctx context.Context) error {
	s.start()
	select {
	case <-s.up:
		return nil
	case <-s.dead:
		return s.err
	case <-s.ctx.Done():
		return ErrStreamClosed
	case <-ctx.Done():
		return errors.Join(ctx.Err(), s.LastError())
	}
}

// Next answers the next event, waiting for it. It answers ErrStreamClosed after Close,
// the refusal that ended the stream, or ctx's error (the stream goes on: a later Next
// answers the events that followed).
func (s *EventStream) Next(ctx context.Context) (Event, error) {
	s.start()
	select {
	case <-s.dead:
		return nil, s.err
	default:
	}
	select {
	case event := <-s.events:
		id := event.Meta().ID
		s.mu.Lock()
		s.lastID = &id
		s.mu.Unlock()
		return event, nil
	case <-s.dead:
		return nil, s.err
	case <-s.ctx.Done():
		return nil, ErrStreamClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close ends the stream and its connection.
func (s *EventStream) Close() error {
	s.cancel()
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if started {
		<-s.done
	}
	return nil
}

func (s *EventStream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		close(s.dead)
	}
}

// worthRetrying says whether a refused or failed connection may succeed later: the
// network, too many streams, a node shutting down or without its storage.
func worthRetrying(err error) bool {
	var transport *TransportError
	var quota *QuotaExceededError
	var api *APIError
	if errors.As(err, &transport) || errors.As(err, &quota) {
		return true
	}
	return errors.As(err, &api) && (api.Code == "storage_failed" || api.Code == "unavailable")
}

// sleep waits d, or less if the stream is closed (then false).
func (s *EventStream) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// pump opens connections one after the other and hands their events to Next.
func (s *EventStream) pump() {
	defer close(s.done)
	s.mu.Lock()
	sent := s.resumeAfter
	s.mu.Unlock()
	pause := firstPause
	for s.ctx.Err() == nil {
		headers := http.Header{"Accept": {"text/event-stream"}, "Cache-Control": {"no-cache"}}
		if sent != nil {
			headers.Set("Last-Event-ID", strconv.FormatUint(*sent, 10))
		}
		k := call{method: http.MethodGet, path: s.path, headers: headers, timeout: s.client.timeout, retry: retrySafe, stream: true}
		response, release, err := s.client.exchange(s.ctx, k)
		if err == nil && response.StatusCode != http.StatusOK {
			answer, _ := io.ReadAll(io.LimitReader(response.Body, 1<<20))
			release()
			err = ParseError(response.StatusCode, answer)
		}
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			if !worthRetrying(err) {
				s.fail(err)
				return
			}
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			if !s.sleep(pause) {
				return
			}
			pause = min(pause*2, maxPause)
			continue
		}
		s.mu.Lock()
		s.connections++
		s.connected = true
		s.mu.Unlock()
		s.upOnce.Do(func() { close(s.up) })
		if s.onConnect != nil {
			s.onConnect()
		}
		received, err := s.read(response.Body, release, &sent)
		release()
		s.mu.Lock()
		s.connected = false
		if s.ctx.Err() == nil {
			s.lastErr = &TransportError{Method: http.MethodGet, Path: s.path, Attempts: []string{"the events stream broke off: " + err.Error()}, Err: err}
		}
		s.mu.Unlock()
		if received {
			// A connection that carried something is reopened at once.
			pause = firstPause
			continue
		}
		if !s.sleep(pause) {
			return
		}
		pause = min(pause*2, maxPause)
	}
}

// read hands the events of one connection to Next until it ends; sent follows the id of
// the last event handed over. It answers whether anything arrived.
func (s *EventStream) read(body io.Reader, cancel func(), sent **uint64) (bool, error) {
	reader := bufio.NewReaderSize(idleReader{r: body, limit: eventsIdleLimit, cancel: cancel}, eventStreamReadBufferBytes)
	var parser sseParser
	received := false
	for {
		line, tooLong, err := readLine(reader, maxEventLine)
		if err == io.EOF {
			return received, errors.New("the server ended the events stream")
		}
		if err != nil {
			return received, err
		}
		received = true
		if tooLong {
			// No event the server sends is this long: the line is dropped, and with it
			// the event it belonged to.
			parser.data, parser.hasData, parser.oversized = nil, true, true
			continue
		}
		data, ok := parser.line(line)
		if !ok {
			continue
		}
		event := parseEvent(data)
		if event == nil {
			continue
		}
		select {
		case s.events <- event:
			id := event.Meta().ID
			*sent = &id
		case <-s.ctx.Done():
			return received, s.ctx.Err()
		}
	}
}
