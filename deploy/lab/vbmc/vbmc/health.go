package vbmc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Health values a system or chassis can be set to (Redfish Resource.Health, DSP0268),
// plus "null": the property is served as null (a BMC that does not report health).
var healthAllowed = map[string]bool{"OK": true, "Warning": true, "Critical": true, "null": true}

// maxLogEntries bounds a system's SEL LogService; the oldest entries are dropped first.
const maxLogEntries = 1000

// HealthUpdate is the control knob's change to one system (Server.SetHealth, or
// POST /vbmc/control/systems/{id}/health with this JSON). Empty fields change nothing.
type HealthUpdate struct {
	// System is the ComputerSystem's Status.Health (and HealthRollup): "OK", "Warning",
	// "Critical" or "null".
	System string `json:"system,omitempty"`
	// Chassis is the system's Chassis' Status.Health (and HealthRollup), same values.
	Chassis string `json:"chassis,omitempty"`
	// Event, when set, is appended to the system's SEL LogService as a LogEntry with
	// this Message (at most 256 bytes).
	Event string `json:"event,omitempty"`
	// Severity of Event: "OK", "Warning" or "Critical"; "" means System if that is
	// Warning or Critical, else "Critical".
	Severity string `json:"severity,omitempty"`
	// ClearLog empties the SEL LogService first (as LogService.ClearLog does).
	ClearLog bool `json:"clear_log,omitempty"`
}

// HealthStatus is a system's current health as the control knob reports it
// (GET /vbmc/control/systems/{id}/health).
type HealthStatus struct {
	System     string `json:"system"`
	Chassis    string `json:"chassis"`
	LogEntries int    `json:"log_entries"`
}

// LogEntry is one entry of a system's SEL LogService (DSP2046 LogEntry.v1).
type LogEntry struct {
	ID       int
	Created  time.Time
	Severity string // "OK", "Warning" or "Critical"
	Message  string
}

// ErrNoSystem is returned by SetHealth and Health for an unknown system ID.
var ErrNoSystem = errors.New("vbmc: no such system")

// ParseHealthUpdate strictly parses a control request body: one JSON object with only
// HealthUpdate's fields, values from their enums, at least one change.
func ParseHealthUpdate(body []byte) (HealthUpdate, error) {
	var u HealthUpdate
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		return HealthUpdate{}, fmt.Errorf("malformed JSON: %v", err)
	}
	if dec.More() {
		return HealthUpdate{}, errors.New("trailing data")
	}
	return u, u.validate()
}

func (u HealthUpdate) validate() error {
	for name, v := range map[string]string{"system": u.System, "chassis": u.Chassis} {
		if v != "" && !healthAllowed[v] {
			return fmt.Errorf("%s %q: want OK, Warning, Critical or null", name, v)
		}
	}
	if u.Severity != "" && (u.Severity == "null" || !healthAllowed[u.Severity]) {
		return fmt.Errorf("severity %q: want OK, Warning or Critical", u.Severity)
	}
	if u.Severity != "" && u.Event == "" {
		return errors.New("severity without event")
	}
	if len(u.Event) > 256 {
		return errors.New("event longer than 256 bytes")
	}
	if u.System == "" && u.Chassis == "" && u.Event == "" && !u.ClearLog {
		return errors.New("nothing to change")
	}
	return nil
}

// SetHealth applies u to system id: its Status.Health, its chassis' Status.Health, and
// an entry in its SEL LogService. Every system starts with both at "OK" and an empty log.
func (s *Server) SetHealth(id string, u HealthUpdate) error {
	if err := u.validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	sys := s.byID[id]
	if sys == nil {
		return fmt.Errorf("%w: %q", ErrNoSystem, id)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if u.ClearLog {
		sys.logs = nil
	}
	if u.System != "" {
		sys.health = u.System
	}
	if u.Chassis != "" {
		sys.chassisHealth = u.Chassis
	}
	if u.Event != "" {
		sev := u.Severity
		if sev == "" {
			sev = "Critical"
			if u.System == "Warning" || u.System == "Critical" {
				sev = u.System
			}
		}
		sys.nextLog++
		sys.logs = append(sys.logs, LogEntry{ID: sys.nextLog, Created: time.Now().UTC().Truncate(time.Second),
			Severity: sev, Message: u.Event})
		if len(sys.logs) > maxLogEntries {
			sys.logs = append([]LogEntry(nil), sys.logs[len(sys.logs)-maxLogEntries:]...)
		}
	}
	s.log.Info("health set", "system", id, "health", sys.health, "chassis", sys.chassisHealth, "event", u.Event)
	return nil
}

// Health returns system id's current health and log size.
func (s *Server) Health(id string) (HealthStatus, error) {
	sys := s.byID[id]
	if sys == nil {
		return HealthStatus{}, fmt.Errorf("%w: %q", ErrNoSystem, id)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	return HealthStatus{System: sys.health, Chassis: sys.chassisHealth, LogEntries: len(sys.logs)}, nil
}

// LogEntries returns system id's SEL LogService entries, oldest first.
func (s *Server) LogEntries(id string) []LogEntry {
	sys := s.byID[id]
	if sys == nil {
		return nil
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	return append([]LogEntry(nil), sys.logs...)
}

// status renders a Redfish Status object (DSP0268 Resource.Status) for health h.
func status(h string) map[string]any {
	var v any = h
	if h == "null" {
		v = nil
	}
	return map[string]any{"State": "Enabled", "Health": v, "HealthRollup": v}
}

func chassisPath(sys *system) string { return "/redfish/v1/Chassis/" + sys.cfg.ID }

func logServicePath(sys *system) string { return systemPath(sys) + "/LogServices/SEL" }

func logEntryDoc(sys *system, e LogEntry) map[string]any {
	id := strconv.Itoa(e.ID)
	return map[string]any{"@odata.id": logServicePath(sys) + "/Entries/" + id, "@odata.type": "#LogEntry.v1_9_0.LogEntry",
		"Id": id, "Name": "Log Entry " + id, "EntryType": "SEL", "Severity": e.Severity,
		"Created": e.Created.Format(time.RFC3339), "Message": e.Message}
}

// healthRoutes adds the LogService resources and the control knob to mux.
func (s *Server) healthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/LogServices", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		writeJSON(w, 200, collection(systemPath(sys)+"/LogServices", "#LogServiceCollection.LogServiceCollection",
			[]string{logServicePath(sys)}))
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/LogServices/SEL", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		p := logServicePath(sys)
		writeJSON(w, 200, map[string]any{"@odata.id": p, "@odata.type": "#LogService.v1_1_3.LogService",
			"Id": "SEL", "Name": "System Event Log", "ServiceEnabled": true, "MaxNumberOfRecords": maxLogEntries,
			"OverWritePolicy": "WrapsWhenFull", "LogEntryType": "SEL", "Status": status("OK"),
			"Entries": odata(p + "/Entries"),
			"Actions": map[string]any{"#LogService.ClearLog": map[string]any{"target": p + "/Actions/LogService.ClearLog"}}})
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/LogServices/SEL/Entries", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		sys.mu.Lock()
		ms := []any{}
		for i := len(sys.logs) - 1; i >= 0; i-- { // newest first, expanded as BMCs serve them
			ms = append(ms, logEntryDoc(sys, sys.logs[i]))
		}
		sys.mu.Unlock()
		writeJSON(w, 200, map[string]any{"@odata.id": logServicePath(sys) + "/Entries",
			"@odata.type": "#LogEntryCollection.LogEntryCollection", "Name": "Log Service Collection",
			"Members": ms, "Members@odata.count": len(ms)})
	})))
	mux.HandleFunc("GET /redfish/v1/Systems/{id}/LogServices/SEL/Entries/{n}", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		sys.mu.Lock()
		defer sys.mu.Unlock()
		for _, e := range sys.logs {
			if e.ID == n {
				writeJSON(w, 200, logEntryDoc(sys, e))
				return
			}
		}
		redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such entry")
	})))
	mux.HandleFunc("POST /redfish/v1/Systems/{id}/LogServices/SEL/Actions/LogService.ClearLog", s.authed(s.onSystem(func(w http.ResponseWriter, r *http.Request, sys *system) {
		sys.mu.Lock()
		sys.logs = nil
		sys.mu.Unlock()
		w.WriteHeader(204)
	})))

	// The control knob (not Redfish): every system by ID, whatever address the
	// connection was made to, with the BMC's credentials.
	mux.HandleFunc("GET /vbmc/control/systems/{id}/health", s.authed(func(w http.ResponseWriter, r *http.Request) {
		h, err := s.Health(r.PathValue("id"))
		if err != nil {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such system")
			return
		}
		writeJSON(w, 200, h)
	}))
	mux.HandleFunc("POST /vbmc/control/systems/{id}/health", s.authed(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			redfishError(w, 400, "Base.1.8.MalformedJSON", "body too large or unreadable")
			return
		}
		u, err := ParseHealthUpdate(body)
		if err != nil {
			redfishError(w, 400, "Base.1.8.PropertyValueNotInList", err.Error())
			return
		}
		if err := s.SetHealth(r.PathValue("id"), u); err != nil {
			redfishError(w, 404, "Base.1.8.ResourceMissingAtURI", "no such system")
			return
		}
		h, _ := s.Health(r.PathValue("id"))
		writeJSON(w, 200, h)
	}))
}
