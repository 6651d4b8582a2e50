package main

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strings"
)

// defaultEnvFile is the service's EnvironmentFile: systemd gives its
// variables to the agent, so the commands a technician runs by hand read it
// too, and a fleet config with ${GATEWAY_ID} checks and inspects the same
// way it runs. EDGEAGENT_ENV_FILE names another file ("" for none).
const defaultEnvFile = "/etc/default/edgeagent"

// configEnv looks a variable up in the process environment first, then in
// the environment file (NAME=value lines, # comments, optional quotes, as
// systemd reads them). A missing default file is no file; a file that
// EDGEAGENT_ENV_FILE names but that is missing, or one that cannot be read
// (not root: the package installs it 0600), is skipped, and unreadable
// says why, for a hint when the config then fails.
func configEnv() (lookup func(string) (string, bool), unreadable error) {
	path, set := os.LookupEnv("EDGEAGENT_ENV_FILE")
	if !set {
		path = defaultEnvFile
	}
	var file map[string]string
	if path != "" {
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			file = parseEnvFile(data)
		case set || !errors.Is(err, fs.ErrNotExist):
			unreadable = err
		}
	}
	return func(name string) (string, bool) {
		if v, ok := os.LookupEnv(name); ok {
			return v, true
		}
		v, ok := file[name]
		return v, ok
	}, unreadable
}

func parseEnvFile(data []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			v = v[1 : len(v)-1]
		}
		out[k] = v
	}
	return out
}
