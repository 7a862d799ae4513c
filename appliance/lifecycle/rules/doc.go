// Package rules is the one home of the field rules of machine records and
// of the records around them (sites, racks, claims, images, BMC addresses):
// machine names (CheckName), free text (CheckText, TextRune, Printable: no
// control, line-separator or bidirectional characters), labels
// (CheckLabel), host names (CheckHostname), BMC addresses (CheckHostPort),
// the sanitising of text that comes from machines (SanitizeText), the
// record-level checks built from them (CheckIntended for a machine's
// operator-owned fields, CheckHardware, CheckLabels, CheckClaim, returning
// *FieldError with the field's JSON path; CheckSite and CheckRack for sites
// and racks, CheckID for an ID an operator chooses), BMC drivers (CheckBMCDriver),
// image formats (CheckImageFormat), and the limits they apply (MaxNameLen, MaxTextLen, MaxDescriptionLen,
// MaxLabelKeyLen, MaxLabelValueLen, MaxHostnameLen, MaxIDLen; bytes of UTF-8;
// MaxRackUnit in rack units).
//
// Every path that accepts such a value calls these functions, so a value one
// path refuses every path refuses: the import of purchase records (package
// intake), the REST API's request bodies (package api), the lifecycle
// controller (claims, BMC enrolments, agent reports), and the kiln CLI,
// which escapes what TextRune refuses before printing a table. Each Check
// function returns nil or an error whose text says what is wrong with the
// value; the caller names the field (a JSON path in the API, a column in an
// import row).
//
// The package imports only the standard library and the store's record
// types (and its one MAC rule, store.ParseMachineMAC). It belongs to the domain
// (appliance/lifecycle and the packages under it), which package api may
// import (deploy/scripts/depcheck).
package rules
