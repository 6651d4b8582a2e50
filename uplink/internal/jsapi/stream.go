package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// StreamConfig is the stream the agent creates for development
// (uplink.nats.create_stream): file storage, limits retention, the
// server's defaults for everything else.
type StreamConfig struct {
	Name       string
	Subjects   []string
	Duplicates time.Duration // the Nats-Msg-Id window
}

// createRequest is the body of $JS.API.STREAM.CREATE: the fields, values
// and order jetstream.StreamConfig marshals to for the same stream
// (TestCreateRequestMatchesJetStream), zeros meaning "server default".
type createRequest struct {
	Name              string         `json:"name"`
	Subjects          []string       `json:"subjects,omitempty"`
	Retention         string         `json:"retention"`
	MaxConsumers      int            `json:"max_consumers"`
	MaxMsgs           int64          `json:"max_msgs"`
	MaxBytes          int64          `json:"max_bytes"`
	Discard           string         `json:"discard"`
	MaxAge            time.Duration  `json:"max_age"`
	MaxMsgsPerSubject int64          `json:"max_msgs_per_subject"`
	Storage           string         `json:"storage"`
	Replicas          int            `json:"num_replicas"`
	Duplicates        time.Duration  `json:"duplicate_window,omitempty"`
	Compression       string         `json:"compression"`
	AllowDirect       bool           `json:"allow_direct"`
	MirrorDirect      bool           `json:"mirror_direct"`
	ConsumerLimits    consumerLimits `json:"consumer_limits"`
}

type consumerLimits struct{}

func (c StreamConfig) request() ([]byte, error) {
	return json.Marshal(createRequest{
		Name: c.Name, Subjects: c.Subjects, Retention: "limits", Discard: "old",
		Storage: "file", Duplicates: c.Duplicates, Compression: "none",
	})
}

// StreamInfo asks whether the stream name exists and returns its subjects
// if it does; else an error matching ErrStreamNotFound, or the error that
// prevented the answer (nats.ErrNoResponders when the server has no
// JetStream).
func StreamInfo(ctx context.Context, nc *nats.Conn, name string) (subjects []string, err error) {
	r, err := streamRequest(ctx, nc, "$JS.API.STREAM.INFO."+name, nil)
	if err != nil {
		return nil, err
	}
	var cfg struct {
		Subjects []string `json:"subjects"`
	}
	if err := json.Unmarshal(r.Config, &cfg); err != nil {
		return nil, fmt.Errorf("%w: stream config: %v", ErrInvalidResponse, err)
	}
	return cfg.Subjects, nil
}

// SubjectMatches reports whether the literal subject matches filter, a
// subject with NATS wildcards ("*" one token, ">" the rest).
func SubjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case f != "*" && f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

// CreateStream creates a stream. Creating one that exists with the same
// configuration succeeds; with another configuration it fails with an
// error matching ErrStreamNameInUse.
func CreateStream(ctx context.Context, nc *nats.Conn, cfg StreamConfig) error {
	req, err := cfg.request()
	if err != nil {
		return err
	}
	_, err = streamRequest(ctx, nc, "$JS.API.STREAM.CREATE."+cfg.Name, req)
	return err
}

// streamRequest makes a stream API request and decodes its answer.
func streamRequest(ctx context.Context, nc *nats.Conn, subject string, body []byte) (*response, error) {
	m, err := nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return nil, err
	}
	var r response
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, r.Error
	}
	if len(r.Config) == 0 {
		return nil, ErrInvalidResponse
	}
	return &r, nil
}
