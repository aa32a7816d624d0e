package config

// CheckVariables exposes checkVariables to the tests of package config_test.
var CheckVariables = checkVariables
