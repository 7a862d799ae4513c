package api

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// Firmware and BIOS baselines (issue 17; appliance/lifecycle/DESIGN.md
// "Firmware and BIOS baselines"), served by the Backend's FirmwareBackend
// methods (lifecycle.Service):
//
//	GET  /v1/baselines                     → 200 BaselineList
//	PUT  /v1/baselines                     Baseline → 200 Baseline (admin; resource_version 0 sets it)
//	POST /v1/machines/{id}/firmware/read   → 200 Machine (the BMC's inventory, BIOS and drift read now)
//	POST /v1/machines/{id}/firmware/apply  ActionRequest → 202 Machine (bring it to the baseline; follow firmware.apply)
//
// Machine.firmware is the record (store.FirmwareRecord); its drift is also in Machine.diff.

// FirmwareBackend is what the firmware routes need (lifecycle.Controller).
type FirmwareBackend interface {
	ReadFirmware(ctx context.Context, id string, w store.W) (store.Machine, error)
	ApplyBaseline(ctx context.Context, id string, w store.W, progress func(store.FirmwareApply)) (store.FirmwareApply, error)
	SetBaseline(ctx context.Context, b store.Baseline, w store.W) (store.Baseline, error)
	Baselines() ([]store.Baseline, error)
}

// Baseline is the wire form of store.Baseline (nothing secret in it).
type Baseline struct {
	Meta
	Vendor   string                   `json:"vendor"`
	Model    string                   `json:"model"`
	Firmware []store.BaselineFirmware `json:"firmware,omitempty"`
	BIOS     map[string]string        `json:"bios,omitempty"`
}

// BaselineList is GET /v1/baselines.
type BaselineList struct {
	Items []Baseline `json:"items"`
}

func baselineView(b store.Baseline) Baseline {
	return Baseline{Meta: metaView(b.Meta), Vendor: b.Vendor, Model: b.Model, Firmware: b.Firmware, BIOS: b.BIOS}
}

func (s *Server) firmware() (FirmwareBackend, error) { return s.b, nil }

func (s *Server) firmwareRoutes(view, op, admin echo.MiddlewareFunc) {
	s.e.GET("/v1/baselines", s.listBaselines, view)
	s.e.PUT("/v1/baselines", s.putBaseline, admin)
	s.e.POST("/v1/machines/:id/firmware/read", s.readFirmware, op)
	s.e.POST("/v1/machines/:id/firmware/apply", s.applyFirmware, op)
}

func firmwareDocOps() []docOp {
	return []docOp{
		{Method: "GET", Path: "/v1/baselines", Summary: "Firmware and BIOS baselines, one per hardware model (vendor + model)",
			Role: RoleViewer, Status: 200, Resp: BaselineList{}},
		{Method: "PUT", Path: "/v1/baselines", Summary: "Set the baseline of a hardware model (firmware component versions with image URIs, BIOS attributes)",
			Role: RoleAdmin, Body: Baseline{}, Status: 200, Resp: Baseline{}},
		{Method: "POST", Path: "/v1/machines/{id}/firmware/read", Summary: "Read the machine's firmware inventory and BIOS attributes from its BMC now (drift in diff)",
			Role: RoleOperator, Status: 200, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/firmware/apply", Summary: "Bring the machine to its model's baseline: firmware, then BIOS, each followed to the end (resets the machine)",
			Role: RoleOperator, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
	}
}

func (s *Server) listBaselines(c echo.Context) error {
	fb, err := s.firmware()
	if err != nil {
		return err
	}
	bs, err := fb.Baselines()
	if err != nil {
		return err
	}
	out := BaselineList{Items: []Baseline{}}
	for _, b := range bs {
		out.Items = append(out.Items, baselineView(b))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) putBaseline(c echo.Context) error {
	fb, err := s.firmware()
	if err != nil {
		return err
	}
	var req Baseline
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if strings.TrimSpace(req.Vendor) == "" || strings.TrimSpace(req.Model) == "" {
		return invalid("vendor", "vendor and model are required")
	}
	b := store.Baseline{Meta: store.Meta{ResourceVersion: req.ResourceVersion}, Vendor: req.Vendor, Model: req.Model,
		Firmware: req.Firmware, BIOS: req.BIOS}
	out, err := fb.SetBaseline(c.Request().Context(), b, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, baselineView(out))
}

func (s *Server) readFirmware(c echo.Context) error {
	fb, err := s.firmware()
	if err != nil {
		return err
	}
	m, err := fb.ReadFirmware(c.Request().Context(), c.Param("id"), s.w(c, "", ""))
	if err != nil && (m.ID == "" || m.Firmware == nil) {
		return err
	}
	// a failed BMC read is recorded on the machine (firmware.error, e.g.
	// "unsupported" for IPMI): the answer shows it
	return c.JSON(http.StatusOK, machineView(m, who(c).Role))
}

// applyTimeout bounds one bring-to-baseline run started by the API.
const applyTimeout = 2 * time.Hour

func (s *Server) applyFirmware(c echo.Context) error {
	fb, err := s.firmware()
	if err != nil {
		return err
	}
	req, err := s.actionBody(c)
	if err != nil {
		return err
	}
	if err := validateWhy(req.Reason, req.Message); err != nil {
		return err
	}
	id := c.Param("id")
	w := s.w(c, "", why(req.Reason, req.Message))
	started := make(chan error, 1)
	go func() {
		// The run outlives the request: its state is on the machine
		// (firmware.apply), written as it progresses.
		ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
		defer cancel()
		once := false
		_, err := fb.ApplyBaseline(ctx, id, w, func(store.FirmwareApply) {
			if !once {
				once = true
				started <- nil
			}
		})
		if !once {
			started <- err
		}
	}()
	select {
	case err := <-started:
		if err != nil {
			return err
		}
	case <-c.Request().Context().Done():
		return c.Request().Context().Err()
	}
	m, err := s.b.GetMachine(id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, machineView(m, who(c).Role))
}

// Wire types shared with the store record (nothing secret in them).
type (
	// BaselineFirmware is one component of a Baseline.
	BaselineFirmware = store.BaselineFirmware
	// FirmwareApply is a bring-to-baseline run (Machine.firmware.apply).
	FirmwareApply = store.FirmwareApply
)
