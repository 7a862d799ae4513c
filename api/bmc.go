package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// BMC enrolment: POST /v1/machines/{id}/bmc (the password is write-only).

func (s *Server) enrollBMC(c echo.Context) error {
	var req BMCEnrollRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if req.Driver == "" {
		req.Driver = "auto"
	}
	switch {
	case req.Address == "":
		return invalid("address", "required: host or host:port of the BMC")
	case rules.CheckHostPort(req.Address) != nil:
		return invalid("address", "%v", rules.CheckHostPort(req.Address))
	case rules.CheckText(req.Username, rules.MaxTextLen) != nil:
		return invalid("username", "%v", rules.CheckText(req.Username, rules.MaxTextLen))
	case rules.CheckBMCDriver(req.Driver) != nil:
		return invalid("driver", "%v", rules.CheckBMCDriver(req.Driver))
	case req.Username == "":
		return invalid("username", "required")
	case req.Password == "":
		return invalid("password", "required")
	}
	b := store.BMC{Address: req.Address, Driver: req.Driver, Username: req.Username,
		InsecureTLS: req.InsecureTLS, CACertPEM: req.CACertPEM}
	out, err := s.b.EnrollBMC(c.Request().Context(), c.Param("id"), b, req.Password, s.w(c, "bmc_enrolled", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, bmcView(out))
}
