package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// StagedTimeout is how long an uncommitted (staged) event of an array publish may live: a publisher that
// crashed between insert and commit leaves such events, and Sweep removes them after this.
const StagedTimeout = time.Hour

// Sweep deletes documents whose expiresAt has passed, from every collection, and staged events older than
// StagedTimeout. It is the retention path on servers without TTL indexes (FerretDB); on MongoDB the TTL
// monitor does the same and Sweep only removes staged leftovers. It returns how many documents it deleted.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	now := s.now()
	var total int64
	if !s.caps.TTLIndexes {
		for _, c := range []*mongo.Collection{s.events, s.deliveries, s.history} {
			res, err := c.DeleteMany(ctx, bson.M{"expiresAt": bson.M{"$lte": now}})
			if err != nil {
				return total, wrap("sweep "+c.Name(), err)
			}
			total += res.DeletedCount
		}
	}
	res, err := s.events.DeleteMany(ctx, bson.M{"staged": true, "createdAt": bson.M{"$lt": now.Add(-StagedTimeout)}})
	if err != nil {
		return total, wrap("sweep staged events", err)
	}
	return total + res.DeletedCount, nil
}
