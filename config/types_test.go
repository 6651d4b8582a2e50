package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string // substring; "" means valid
	}{
		{"0", 0, ""},
		{"1048576", 1 << 20, ""},
		{"512MiB", 512 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"256KiB", 256 << 10, ""},
		{"2TiB", 2 << 40, ""},
		{"10MB", 10_000_000, ""},
		{"1KB", 1000, ""},
		{"3GB", 3_000_000_000, ""},
		{"1TB", 1_000_000_000_000, ""},
		{"7B", 7, ""},
		{"1.5GiB", 1536 << 20, ""},
		{"0.5KiB", 512, ""},
		{" 64 KiB ", 64 << 10, ""},
		{"10mib", 10 << 20, ""},
		{"1_000", 1000, ""},
		{"8EiB", 0, `unknown unit "EiB"`},
		{"10 M", 0, `"M" is ambiguous, write MiB or MB`},
		{"1k", 0, `"k" is ambiguous, write KiB or KB`},
		{"1.5B", 0, "not a whole number of bytes"},
		{"0.1KB", 100, ""},
		{"0.0001KB", 0, "not a whole number of bytes"},
		{"9223372036854775807", 9223372036854775807, ""},
		{"9223372036854775808", 0, "too large"},
		{"8192PiB", 0, "unknown unit"},
		{"9000000TiB", 0, "too large"},
		{"-1", 0, "is not a size"},
		{"", 0, "is not a size"},
		{"MiB", 0, "is not a size"},
		{"1..2MiB", 0, "is not a size"},
		{".5MiB", 0, "is not a size"},
		{"5.MiB", 0, "is not a size"},
		{"lots", 0, "is not a size"},
	} {
		got, err := parseSize(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("parseSize(%q): %v", tc.in, err)
		case tc.err == "" && int64(got) != tc.want:
			t.Errorf("parseSize(%q) = %d, want %d", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseSize(%q) = %d, %v; want an error with %q", tc.in, got, err, tc.err)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   Size
		want string
	}{
		{0, "0"},
		{1, "1"},
		{1000, "1KB"},
		{1024, "1KiB"},
		{1536, "1536"}, // 1.5KiB: only bytes represent it as a whole number
		{512 << 20, "512MiB"},
		{1 << 30, "1GiB"},
		{10_000_000, "10MB"},
		{1_000_001, "1000001"},
		{3 << 40, "3TiB"},
		{-5, "-5"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(tc.in), got, tc.want)
		}
		if tc.in < 0 {
			continue
		}
		back, err := parseSize(tc.in.String())
		if err != nil || back != tc.in {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in.String(), back, err, tc.in)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"10s", 10 * time.Second, ""},
		{"5m", 5 * time.Minute, ""},
		{"168h", 168 * time.Hour, ""},
		{"1h30m", 90 * time.Minute, ""},
		{"5ms", 5 * time.Millisecond, ""},
		{"0", 0, ""},
		{"-1s", -time.Second, ""},
		{" 2s ", 2 * time.Second, ""},
		{"10 seconds", 0, `"10 seconds" is not a duration (write e.g. 10s, 5m or 1h30m)`},
		{"30", 0, `"30" is not a duration: add a unit, e.g. 30s`},
		{"7d", 0, `"7d" is not a duration: days are written in hours, e.g. 168h`},
		{"", 0, "empty duration"},
	} {
		got, err := parseDuration(tc.in)
		switch {
		case tc.err == "" && (err != nil || time.Duration(got) != tc.want):
			t.Errorf("parseDuration(%q) = %v, %v; want %v", tc.in, time.Duration(got), err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseDuration(%q) = %v; want an error with %q", tc.in, err, tc.err)
		}
	}
}

func TestDurationString(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{time.Hour, "1h"},
		{168 * time.Hour, "168h"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + 10*time.Minute, "1h10m"},
		{10 * time.Minute, "10m"},
		{time.Minute + time.Second, "1m1s"},
		{time.Hour + time.Second, "1h0m1s"},
		{1500 * time.Millisecond, "1.5s"},
		{5 * time.Millisecond, "5ms"},
		{-time.Minute, "-1m"},
	} {
		d := Duration(tc.in)
		if got := d.String(); got != tc.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tc.in, got, tc.want)
		}
		if back, err := parseDuration(d.String()); err != nil || back != d {
			t.Errorf("parseDuration(%q) = %v, %v", d.String(), back, err)
		}
		if d.Duration() != tc.in {
			t.Errorf("Duration() = %v", d.Duration())
		}
	}
}

func TestTextMarshaling(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("1h30m")); err != nil || d.Duration() != 90*time.Minute {
		t.Errorf("UnmarshalText: %v, %v", d, err)
	}
	if b, _ := d.MarshalText(); string(b) != "1h30m" {
		t.Errorf("MarshalText = %q", b)
	}
	if err := d.UnmarshalText([]byte("soon")); err == nil || !strings.HasPrefix(err.Error(), "config: ") {
		t.Errorf("UnmarshalText(soon) = %v", err)
	}
	var s Size
	if err := s.UnmarshalText([]byte("2GiB")); err != nil || s.Bytes() != 2<<30 {
		t.Errorf("UnmarshalText: %v, %v", s, err)
	}
	if b, _ := s.MarshalText(); string(b) != "2GiB" {
		t.Errorf("MarshalText = %q", b)
	}
	if err := s.UnmarshalText([]byte("big")); err == nil || !strings.HasPrefix(err.Error(), "config: ") {
		t.Errorf("UnmarshalText(big) = %v", err)
	}
}
