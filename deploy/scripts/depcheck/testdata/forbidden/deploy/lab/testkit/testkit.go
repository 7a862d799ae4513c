package testkit
