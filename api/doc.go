// Package api is Kiln's REST API: the site team's and central's way to see
// and steer machines, and the in-RAM agent's way to report.
//
// It owns HTTP only: routing (echo/v4), bearer-token auth with roles, JSON
// decoding that rejects unknown fields and anything after the one value
// (400 trailing_data), validation that names the field, the
// one error handler that maps errors to statuses and stable codes, request
// metrics with bounded labels, /metrics, /healthz, /readyz and the OpenAPI
// 3.0 document at /v1/openapi.json. Everything else goes through Backend,
// which the domain implements (lifecycle.Service; the appliance adds
// Health): handlers decode, call Backend, and answer with view types
// (view.go); the domain applies the field rules of machine records and
// claims (package rules) and its *rules.FieldError names the field.
//
// Routes (roles: viewer < operator < admin; agent is separate):
//
//	GET    /healthz, /readyz, /metrics, /v1/openapi.json       no auth
//	GET    /v1/site/status                                      viewer
//	GET    /v1/sites  /v1/sites/{id}                            viewer
//	POST   /v1/sites   PUT /v1/sites/{id}                       admin
//	GET    /v1/racks[?site=]  /v1/racks/{id}                    viewer
//	POST   /v1/racks   PUT /v1/racks/{id}                       admin
//	GET    /v1/machines?state=&rack=&label=k=v&limit=&after=    viewer (next cursor in the body)
//	GET    /v1/machines/{id}                                    viewer
//	POST   /v1/machines                                         admin (one registered machine)
//	POST   /v1/machines/import?format=csv|json|netbox           admin (all or nothing)
//	PATCH  /v1/machines/{id}                                    admin (intended fields; resource_version → 409)
//	POST   /v1/machines/{id}/provision|release|erase|inspect    operator
//	POST   /v1/machines/claim                                   operator (N machines by role and labels)
//	POST   /v1/machines/{id}/bmc                                admin (password write-only)
//	GET    /v1/images  /v1/images/{id}                          viewer
//	POST   /v1/images?name=&version=&sha256=&format=&size=      admin (streamed body; the store picks the ID)
//	PUT    /v1/images/{id}?name=&version=&sha256=&format=&size= admin (under that ID; same image again → 200, other → 409)
//	DELETE /v1/images/{id}                                      admin
//	GET    /v1/jobs[?machine=]  /v1/jobs/{id}                   viewer
//	GET    /v1/events?after=CURSOR&limit=&wait=30s              viewer (long-poll)
//	GET    /v1/leases[?consistent=true]                         viewer (this node's replica, one per address)
//	POST   /v1/agent/register, GET /v1/agent/task, POST /v1/agent/report   agent
//
// Beside the routes, Server.Mount serves other handlers on the same
// listener: the appliance mounts the web UI (package api/ui) at /ui/ and
// redirects GET / to it. The UI signs a token in with Server.Authenticate
// and calls these routes in process (Server.LocalHandler) with it.
//
// Errors are {"error":{"code":"...","message":"...","field":"..."}} with the
// codes listed as Code* constants: store.ErrNotFound → 404 not_found,
// store.ErrConflict → 409 conflict, *store.IllegalTransitionError → 409
// illegal_transition (from, to), validation → 400 invalid / unknown_field /
// bad_json / trailing_data naming the field, *intake.ErrRows → 400
// import_rejected (rows), store.ErrNotLeader → 503 not_leader (leader), 401
// unauthorized, 403 forbidden, 408 body_timeout, 400 body_incomplete.
//
// Agent requests carry the per-boot token of the kernel command line
// (kiln.token) and name their machine in the X-Kiln-Machine header
// (required); the token must be that machine's (Backend.VerifyAgentToken),
// checked before the body is read, and a body's machine_id, when present,
// must name the same machine. An agent token of machine A can never act for
// machine B.
//
// Every credential is checked before a request body is read; a body read
// waits at most Config.BodyIdleTimeout for the next bytes and a JSON body
// arrives whole within Config.JSONBodyTimeout (408 body_timeout); a body
// the client cuts off is 400 body_incomplete and nothing of it is kept.
// body.go says why there is no whole-request ReadTimeout.
//
// Static tokens are configured hashed (TokenSpec.SHA256 = hex SHA-256);
// LoadOrCreateAdminToken makes the first admin token (0600 file). Metrics are
// documented in METRICS.md.
package api
