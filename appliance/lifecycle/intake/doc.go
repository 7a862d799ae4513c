// Package intake turns a purchase record or rack plan into registered
// machines with their intended fields (top-level DESIGN.md "Machine
// records").
//
// Three formats are read by Parse:
//
//   - "csv": Kiln's own columns (header row required, any order, case-insensitive):
//     name, serial, vendor, model, site, rack, u, bmc_address, bmc_mac,
//     macs (semicolon-separated), cpus, memory_gib, disks (e.g. "2x960GB" or
//     "2x960GB+4x3.84TB"), boot_mode (uefi|legacy), ipv4, labels (k=v;k=v),
//     root_disk_serial, root_disk_min_gib, wipe (true|false).
//   - "json": an array of objects (or {"machines": [...]}) with the same keys;
//     macs may be an array, labels an object, numbers and booleans typed.
//   - "netbox": a NetBox device CSV export (UI export or bulk-import columns),
//     mapped where a column has a Kiln meaning: Name, Serial number, Asset tag,
//     Site, Rack, Position, Device type/Type, Manufacturer, Role, Tenant,
//     Location, Platform, Primary IPv4; other columns are ignored.
//
// Every bad row is reported with its line and field in *ErrRows; a file with
// any bad row yields no machines ("a file with any bad row imports nothing").
//
// Every field is checked by the domain's one set of field rules (package
// kiln/appliance/lifecycle/rules: names, free text, labels, host names, BMC
// addresses), the same functions the REST API and the lifecycle controller
// apply, so a value an import accepts is one every later request accepts.
//
// MACs follow store.ParseMachineMAC (EUI-48, unicast, not all zeros) and are
// normalised to lower-case colon form. The checks here are per row; that a
// name, serial or MAC is used by one machine only — within the file and
// against stored machines — is decided by the store when the rows are
// written (store.ImportMachines), which the lifecycle maps back to lines.
package intake
