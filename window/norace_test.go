//go:build !race

package window

// raceDetector is true when the tests run under the race detector.
const raceDetector = false
