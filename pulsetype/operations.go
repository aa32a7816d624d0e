package pulsetype

import (
	"fmt"
	"slices"
	"strings"
)

// Operational events: the sidecar publishes its own events on reserved topics, stored and delivered like any
// other event (docs/operations.md). Applications cannot publish to ReservedTopicPrefix.
const (
	// ReservedTopicPrefix starts every topic of the sidecar's own events; a publish to it answers 400
	// reserved_topic.
	ReservedTopicPrefix = "pulse."
	// TopicEndpointDisabled: the sidecar disabled an endpoint (410 Gone, or disableAfter of failures).
	TopicEndpointDisabled = "pulse.endpoint.disabled"
	// TopicEndpointEnabled: a disabled endpoint was resumed.
	TopicEndpointEnabled = "pulse.endpoint.enabled"
	// TopicDeliveryFailed: a delivery ended in error (retries used up, a terminal status, the retry window).
	TopicDeliveryFailed = "pulse.delivery.failed"
	// TopicBacklogHigh: a group's oldest pending delivery passed its endpoint's backlogAlertAfter (high
	// true), or no longer does (high false).
	TopicBacklogHigh = "pulse.backlog.high"
	// SubjectGroupHeader is the header of an operational event that names the consumer group it is about:
	// that group never receives the event (see WantsInput), so a disabled endpoint cannot receive its own
	// disable event. It is not the webhook request's Pulse-Consumer-Group header, which names the group
	// receiving the POST (an operations receiver's), hence its own name.
	SubjectGroupHeader = "pulse-subject-group"
	// legacySubjectGroupHeader is SubjectGroupHeader's name up to 0.1.0: events stored under it (published
	// by an older sidecar, not fanned out yet) still never reach the group they are about.
	legacySubjectGroupHeader = "pulse-consumer-group"
)

// OperationalTopics are the topics of the sidecar's own events, every one of three segments: a subscription
// entry under ReservedTopicPrefix must match one of them (unreachableTopic).
var OperationalTopics = []string{TopicEndpointDisabled, TopicEndpointEnabled, TopicDeliveryFailed, TopicBacklogHigh}

// unreachableTopic returns why the subscription entry entry can never match a topic, or "" when it can: a
// pattern "p.*" whose topics (p, a dot, one segment) are longer than a topic may be, and an entry under
// ReservedTopicPrefix that matches none of OperationalTopics (applications cannot publish there). Only the
// lowercase prefix is reserved: topics are case-sensitive, so "PULSE.x" is an application's topic.
func unreachableTopic(entry string) string {
	if p, ok := strings.CutSuffix(entry, ".*"); ok && len(p)+2 > maxTopicLen {
		return fmt.Sprintf("%q can never match: its topics have at least %d characters, and a topic has at most %d", entry, len(p)+2, maxTopicLen)
	}
	if !Reserved(entry) || slices.ContainsFunc(OperationalTopics, func(t string) bool { return TopicMatches(entry, t) }) {
		return ""
	}
	return fmt.Sprintf("%q can never match: topics under %q are the sidecar's own (%s), three segments each; subscribe to pulse.endpoint.*, pulse.delivery.*, pulse.backlog.* or one of them",
		entry, ReservedTopicPrefix, strings.Join(OperationalTopics, ", "))
}

// Reserved reports whether topic is one of the sidecar's own (it starts with ReservedTopicPrefix).
func Reserved(topic string) bool { return strings.HasPrefix(topic, ReservedTopicPrefix) }

// aboutItself reports whether ev is an operational event about the consumer group group itself.
func aboutItself(ev *Event, group string) bool {
	if !Reserved(ev.Topic) || group == "" {
		return false
	}
	subject, ok := ev.Headers[SubjectGroupHeader]
	if !ok {
		subject = ev.Headers[legacySubjectGroupHeader]
	}
	return subject == group
}
