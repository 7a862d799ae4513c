// A package at the module root.
package kiln
