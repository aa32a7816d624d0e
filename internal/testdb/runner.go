package testdb

import "testing"

// Runner returns m with its Run replaced by Main's, for goleak.VerifyTestMain, which then looks for leaked
// goroutines once the tests ran and the database server started for them stopped:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Runner(m)) }
func Runner(m *testing.M) interface{ Run() int } { return runner{m} }

type runner struct{ m *testing.M }

func (r runner) Run() int { return Main(r.m) }
