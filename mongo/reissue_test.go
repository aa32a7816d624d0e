package mongo

import (
	"context"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// The store re-issues a write the driver does not retry (updateMany, deleteMany, a bulk holding them) when it
// fails for the topology's sake, and only then: a stepdown's NotWritablePrimary or a RetryableWriteError label
// is sent again until it succeeds (reissueTries in all), a duplicate key or a cancelled context is not.
func TestReissue(t *testing.T) {
	t.Parallel()
	stepdown := mongo.CommandError{Code: 10107, Name: "NotWritablePrimary", Message: "not primary"}
	labelled := mongo.CommandError{Code: 1, Labels: []string{"RetryableWriteError"}}
	duplicate := mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "dup"}}}
	for _, tt := range []struct {
		name      string
		failures  []error // what the tries answer, in order; nil after them
		wantCalls int
		wantErr   error
	}{
		{"a stepdown, then success", []error{stepdown}, 2, nil},
		{"a labelled error twice, then success", []error{labelled, labelled}, 3, nil},
		{"a stepdown every time", []error{stepdown, stepdown, stepdown, stepdown}, reissueTries, stepdown},
		{"a duplicate key", []error{duplicate}, 1, duplicate},
		{"cancelled", []error{context.Canceled}, 1, context.Canceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := reissue(context.Background(), func(context.Context) error {
				calls++
				if calls <= len(tt.failures) {
					return tt.failures[calls-1]
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("write sent %d times, want %d", calls, tt.wantCalls)
			}
			if (err == nil) != (tt.wantErr == nil) || err != nil && err.Error() != tt.wantErr.Error() {
				t.Errorf("reissue = %v, want %v", err, tt.wantErr)
			}
		})
	}
	if !retryableWrite(stepdown) || !retryableWrite(labelled) || retryableWrite(duplicate) || retryableWrite(errors.New("x")) {
		t.Error("retryableWrite classifies a stepdown, a labelled error, a duplicate key and a plain error wrongly")
	}
}
