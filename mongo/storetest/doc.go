// Package storetest is the storage suite of the sidecar: the cases every store of the MongoDB protocol must
// pass, written against the interfaces the store's callers own (dispatcher.Store, httpapi.Store,
// reconciler.Store; see Store), so that another implementation runs them by calling Run with a Harness of
// its own. Package mongo runs them from its external tests (mongo_test).
//
// A case gets a fresh database of the harness's server and a fake clock (see Bundle); it reads what the
// store wrote through the server's own client where the case is about the stored documents. Cases are
// grouped by the step of the delivery lifecycle they exercise, one file each: endpoints.go, publish.go,
// fanout.go, claim.go, lines.go, complete.go, reap.go, operate.go.
//
// What the server can do is detected, never assumed from its name (ProbeFeatures): a case that needs a
// feature the server lacks skips, naming the feature and where the case runs instead. Race cases run once
// per Features.Serializations (the embedded database's linearized and interleaved orders) or once in the
// server's own order.
package storetest
