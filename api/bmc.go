package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// BMC enrolment: POST /v1/machines/{id}/bmc (the password is write-only).
// The field rules are the domain's (rules.CheckBMC, applied by EnrollBMC).

func (s *Server) enrollBMC(c echo.Context) error {
	var req BMCEnrollRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	b := store.BMC{Address: req.Address, Driver: req.Driver, Username: req.Username,
		InsecureTLS: req.InsecureTLS, CACertPEM: req.CACertPEM}
	out, err := s.b.EnrollBMC(c.Request().Context(), c.Param("id"), b, req.Password, s.w(c, "bmc_enrolled", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, bmcView(out))
}
