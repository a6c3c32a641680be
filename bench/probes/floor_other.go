//go:build !linux

package main

import "time"

// The floor is measured on Linux only.
type floorLoop struct{}

func newFloor(string, int, time.Duration) (*floorLoop, error) { return nil, nil }

func (*floorLoop) close() {}

func (*floorLoop) run(string, time.Duration) sample { return sample{} }
