package mongo

import (
	"context"
	"time"

	"github.com/rs/zerolog"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/pulse-sidecar/pulse/pulsetype"
)

// WatchEvents runs a change stream on the events collection and calls wake for every inserted or committed
// event, until ctx is done. It blocks. Change streams only wake sleeping dispatchers (docs/delivery.md): polling and
// reconciliation still guarantee progress, so a missed notification loses nothing. When the stream fails
// (or cannot be opened) the error is logged and the stream reopened after retry.
func (s *Store) WatchEvents(ctx context.Context, retry time.Duration, wake func(), log zerolog.Logger) {
	log = log.With().Str("component", "change-stream").Logger()
	pipeline := mongo.Pipeline{{{Key: "$match", Value: bson.M{"operationType": bson.M{"$in": bson.A{"insert", "update"}}}}}}
	for ctx.Err() == nil {
		stream, err := s.events.Watch(ctx, pipeline)
		if err == nil {
			for stream.Next(ctx) {
				wake()
			}
			err = stream.Err()
			_ = stream.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		log.Error().Err(err).Dur("retry_in", retry).Msg("change stream failed; polling continues and the stream is reopened")
		select {
		case <-ctx.Done():
			return
		case <-time.After(pulsetype.Jittered(retry)):
		}
	}
}
