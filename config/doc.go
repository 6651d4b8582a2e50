// Package config loads, validates and prints the agent's one YAML configuration file.
//
// Loading goes: ${NAME} references → strict decode over Default() →
// derived defaults (ApplyDerived) → Validate. Every problem found on the
// way is reported at once in an *Errors, one line per problem naming the
// file, the line and the full key path:
//
//	config.yaml:12: mqtt.subscriptions[0].qos: must be 0, 1 or 2, not 3
//	config.yaml:31: storage.bronze_retension: unknown key (did you mean bronze_retention?)
//
// The key names and defaults are documented in docs/config.md, and
// example.yaml in this directory is a commented file holding every key.
//
// # Environment references
//
// A value may contain ${NAME}, replaced by the environment variable NAME
// (an unset variable is an error naming the line). Only that form exists;
// $${ writes a literal ${. References are found in the raw text, so lines
// stay right, but they are expanded inside the parsed value, so a secret
// may hold any character ('#', '"', ": ", newlines) without changing the
// document, and a reference in a comment is never looked up.
//
// # Caveats
//
//   - A key with no value (`key:`) or null keeps the default.
//   - A list replaces the default list; it is not appended to.
//   - Anchors, aliases and merge keys (<<: *defaults) work; tags are
//     ignored, the field decides the type.
//   - Validate does not touch the file system: files named in the config
//     (TLS, NATS credentials) are checked by CheckFiles.
//   - A YAML syntax error stops parsing, so it is reported alone.
package config
