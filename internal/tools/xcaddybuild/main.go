// Command xcaddybuild builds Caddy with the plugins listed in xcaddy.json,
// using the xcaddy version and Caddy version pinned there.
//
//	go run ./internal/tools/xcaddybuild [-config xcaddy.json] [-output bin/caddy]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

type config struct {
	CaddyVersion  string `json:"caddy_version"`
	XcaddyVersion string `json:"xcaddy_version"`
	Plugins       []struct {
		Module  string `json:"module"`
		Version string `json:"version,omitempty"`
		Replace string `json:"replace,omitempty"`
	} `json:"plugins"`
}

func main() {
	cfgPath := flag.String("config", "xcaddy.json", "the build pins")
	output := flag.String("output", "bin/caddy", "where the binary goes")
	flag.Parse()
	if err := run(*cfgPath, *output); err != nil {
		fmt.Fprintln(os.Stderr, "xcaddybuild:", err)
		os.Exit(1)
	}
}

func run(cfgPath, output string) error {
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	if cfg.CaddyVersion == "" || cfg.XcaddyVersion == "" || len(cfg.Plugins) == 0 {
		return fmt.Errorf("%s needs caddy_version, xcaddy_version and plugins", cfgPath)
	}
	base := filepath.Dir(cfgPath)
	out, err := filepath.Abs(output)
	if err != nil {
		return err
	}
	args := []string{"run", "github.com/caddyserver/xcaddy/cmd/xcaddy@" + cfg.XcaddyVersion, "build", cfg.CaddyVersion, "--output", out}
	for _, p := range cfg.Plugins {
		with := p.Module
		switch {
		case p.Replace != "":
			dir, err := filepath.Abs(filepath.Join(base, p.Replace))
			if err != nil {
				return err
			}
			with += "=" + dir
		case p.Version != "":
			with += "@" + p.Version
		}
		args = append(args, "--with", with)
	}
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// xcaddy runs `go get` on a replaced plugin's path too; a module proxy
	// refuses a path that is not published, so fall back to nothing (the
	// replacement serves it) instead of to a direct fetch.
	cmd.Env = append(os.Environ(), "GOPROXY="+proxyWithoutDirect())
	fmt.Println("go", strings.Join(args, " "))
	return cmd.Run()
}

func proxyWithoutDirect() string {
	out, err := exec.Command("go", "env", "GOPROXY").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || p == "" || p == "off" {
		p = "https://proxy.golang.org"
	}
	p = strings.TrimSuffix(strings.TrimSuffix(p, ",direct"), "|direct")
	if p == "direct" {
		return "direct"
	}
	return p + "|off"
}
