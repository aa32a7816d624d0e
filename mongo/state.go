package mongo

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// notActive matches a subscription document whose endpoint is paused or disabled.
var notActive = bson.M{"$in": bson.A{pulsetype.EndpointPaused, pulsetype.EndpointDisabled}}

// SetEndpointState pauses (state paused, reason paused) or resumes (state active) a consumer group's
// endpoint and returns it as stored. Pausing a paused endpoint keeps its stateSince; pausing a disabled one
// makes it paused. Resuming clears the state, its reason and since, and the failing streak of disableAfter,
// so a disabled endpoint starts afresh. The registration (and updatedAt) is not changed. It returns
// pulsetype.ErrNotFound when the group has no endpoint.
func (s *Store) SetEndpointState(ctx context.Context, group string, state pulsetype.EndpointState) (*pulsetype.Endpoint, error) {
	var update bson.M
	filter := bson.M{"_id": group}
	switch state {
	case pulsetype.EndpointPaused:
		filter["stateReason"] = bson.M{"$ne": pulsetype.ReasonPaused} // only the API pauses
		update = bson.M{"$set": bson.M{"state": pulsetype.EndpointPaused, "stateReason": pulsetype.ReasonPaused, "stateSince": s.now()}}
	case pulsetype.EndpointActive:
		update = bson.M{"$unset": bson.M{"state": "", "stateReason": "", "stateSince": "", "failingSince": ""}}
	default:
		return nil, errors.New("set endpoint state: only paused or active may be set")
	}
	if _, err := s.subscriptions.UpdateOne(ctx, filter, update); err != nil {
		return nil, wrap("set endpoint state", err)
	}
	return s.GetEndpoint(ctx, group)
}

// DisableEndpoint disables a consumer group's endpoint for reason (gone or failing) with one fenced write,
// when it is active; failingBefore, when not zero, also requires its failing streak (see RecordHealth) to
// have begun at or before that time. It reports whether this call disabled it.
func (s *Store) DisableEndpoint(ctx context.Context, group string, reason pulsetype.StateReason, failingBefore time.Time) (bool, error) {
	filter := bson.M{"_id": group, "state": bson.M{"$nin": bson.A{pulsetype.EndpointPaused, pulsetype.EndpointDisabled}}}
	if !failingBefore.IsZero() {
		filter["failingSince"] = bson.M{"$lte": failingBefore}
	}
	res, err := s.subscriptions.UpdateOne(ctx, filter, bson.M{"$set": bson.M{
		"state": pulsetype.EndpointDisabled, "stateReason": reason, "stateSince": s.now()}})
	if err != nil {
		return false, wrap("disable endpoint", err)
	}
	return res.ModifiedCount > 0, nil
}

// InactiveGroups returns which of groups have a paused or disabled endpoint, with one query by _id: the
// dispatcher asks it after leasing attempts, so that no attempt leased after a pause is POSTed.
func (s *Store) InactiveGroups(ctx context.Context, groups []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(groups) == 0 {
		return out, nil
	}
	docs, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "read endpoint states",
		bson.M{"_id": bson.M{"$in": groups}, "state": notActive}, options.Find().SetProjection(bson.M{"_id": 1}))
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		out[d.ID] = true
	}
	return out, nil
}

// RecordHealth keeps the failing streaks of endpoints that have a disableAfter: failed names the groups
// whose attempts just failed (the receiver's failures), succeeded those with a success (a success wins). A
// streak starts at the first failure after a success and ends with the next success; each group of
// failed whose streak has lasted its disableAfter is disabled (reason failing), and returned. It costs up to
// two updateMany, plus one update per failed group.
func (s *Store) RecordHealth(ctx context.Context, failed map[string]time.Duration, succeeded []string) (disabled []string, err error) {
	now := s.now()
	if len(succeeded) > 0 {
		if _, err := s.updateMany(ctx, s.subscriptions, bson.M{"_id": bson.M{"$in": succeeded}, "failingSince": bson.M{"$ne": nil}},
			bson.M{"$unset": bson.M{"failingSince": ""}}); err != nil {
			return nil, wrap("end failing streaks", err)
		}
	}
	if len(failed) == 0 {
		return nil, nil
	}
	groups := make([]string, 0, len(failed))
	for g := range failed {
		groups = append(groups, g)
	}
	if _, err := s.updateMany(ctx, s.subscriptions, bson.M{"_id": bson.M{"$in": groups}, "failingSince": nil},
		bson.M{"$set": bson.M{"failingSince": now}}); err != nil {
		return nil, wrap("start failing streaks", err)
	}
	for g, after := range failed {
		ok, err := s.DisableEndpoint(ctx, g, pulsetype.ReasonFailing, now.Add(-after))
		if err != nil {
			return disabled, err
		}
		if ok {
			disabled = append(disabled, g)
		}
	}
	return disabled, nil
}

// EndpointStates returns the state of every consumer group's endpoint, with one query (for /metrics).
func (s *Store) EndpointStates(ctx context.Context) (map[string]pulsetype.EndpointState, error) {
	docs, err := findAll[subscriptionDoc](ctx, s, s.subscriptions, "read endpoint states", bson.M{},
		options.Find().SetProjection(bson.M{"_id": 1, "state": 1}))
	if err != nil {
		return nil, err
	}
	out := make(map[string]pulsetype.EndpointState, len(docs))
	for _, d := range docs {
		out[d.ID] = cmp.Or(d.State, pulsetype.EndpointActive)
	}
	return out, nil
}
