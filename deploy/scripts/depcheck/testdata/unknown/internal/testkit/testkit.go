// A folder the rules table does not know.
package testkit
