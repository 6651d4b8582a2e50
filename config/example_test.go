package config_test

import (
	"errors"
	"fmt"

	"github.com/edgeagent/edgeagent/config"
)

// A technician's file with three mistakes: all three are reported at once,
// each with its line and key.
func ExampleParse() {
	const file = `
gateway_id: gw-01
mqtt:
  password: ${MQTT_PASSWORD}
  subscriptions:
    - topic: "sensors/{device}/telemetry"
      qos: 3
storage:
  bronze_retension: 72h
`
	env := func(name string) (string, bool) { return "", false } // nothing set
	_, err := config.Parse("config.yaml", []byte(file), env)
	fmt.Println(err)
	fmt.Println(errors.Is(err, config.ErrInvalid))
	// Output:
	// config.yaml:4: mqtt.password: environment variable MQTT_PASSWORD is not set
	// config.yaml:7: mqtt.subscriptions[0].qos: must be 0, 1 or 2, not 3
	// config.yaml:9: storage.bronze_retension: unknown key (did you mean bronze_retention?)
	// true
}

func ExampleConfig_Redacted() {
	const file = `
gateway_id: gw-01
mqtt:
  broker: tcp://edge:hunter2@127.0.0.1:1883
  username: edge
  password: ${MQTT_PASSWORD}
  subscriptions:
    - topic: "sensors/{device}/telemetry"
`
	env := func(name string) (string, bool) { return "s3cret", name == "MQTT_PASSWORD" }
	c, err := config.Parse("config.yaml", []byte(file), env)
	if err != nil {
		fmt.Println(err)
		return
	}
	r := c.Redacted()
	fmt.Println(r.MQTT.Broker)
	fmt.Println(r.MQTT.Password, c.MQTT.Password)
	// Output:
	// tcp://edge:***@127.0.0.1:1883
	// *** s3cret
}

func ExampleParseCondition() {
	when, err := config.ParseCondition("mean > 80")
	if err != nil {
		fmt.Println(err)
		return
	}
	clear := when.Negate()
	fmt.Println(when, "|", clear)
	fmt.Println(when.Holds(85), clear.Holds(85))
	// Output:
	// mean > 80 | mean <= 80
	// true false
}
