package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrCorrupt is returned by Decode for bytes that are not an encoded Message.
var ErrCorrupt = errors.New("local: corrupt message")

// Message is one message for the local broker: the Data of an
// outbox.KindLocal row.
type Message struct {
	Topic   string
	Payload []byte
	Retain  bool
	QoS     byte // 0, 1 or 2
}

// messageVersion is the first byte of every encoded Message.
const messageVersion = 1

const flagRetain = 1

// Encode returns m's byte form: version (1), flags (bit 0: retain), QoS,
// uvarint topic length, topic, payload. It is deterministic.
func Encode(m Message) []byte {
	b := make([]byte, 0, 3+binary.MaxVarintLen64+len(m.Topic)+len(m.Payload))
	var flags byte
	if m.Retain {
		flags |= flagRetain
	}
	b = append(b, messageVersion, flags, m.QoS)
	b = binary.AppendUvarint(b, uint64(len(m.Topic)))
	b = append(b, m.Topic...)
	return append(b, m.Payload...)
}

// Decode parses the output of Encode. The returned Payload aliases b.
func Decode(b []byte) (Message, error) {
	if len(b) < 4 {
		return Message{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != messageVersion {
		return Message{}, fmt.Errorf("%w: version %d", ErrCorrupt, b[0])
	}
	if b[1]&^flagRetain != 0 {
		return Message{}, fmt.Errorf("%w: flags %#x", ErrCorrupt, b[1])
	}
	if b[2] > 2 {
		return Message{}, fmt.Errorf("%w: qos %d", ErrCorrupt, b[2])
	}
	n, k := binary.Uvarint(b[3:])
	if k <= 0 || n == 0 || n > uint64(len(b)-3-k) {
		return Message{}, fmt.Errorf("%w: topic length", ErrCorrupt)
	}
	rest := b[3+k:]
	topic := string(rest[:n])
	if !utf8.ValidString(topic) {
		return Message{}, fmt.Errorf("%w: topic is not UTF-8", ErrCorrupt)
	}
	return Message{Topic: topic, Payload: rest[n:], Retain: b[1]&flagRetain != 0, QoS: b[2]}, nil
}
