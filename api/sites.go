package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// Sites and racks: GET, POST and PUT /v1/sites and /v1/racks. ResourceVersion
// absent creates, present updates with compare-and-set. The field rules are
// the domain's (rules.CheckSite, rules.CheckRack, applied by the backend's
// PutSite and PutRack); this file checks only what belongs to the request:
// resource_version present or absent, the ID in the body against the path.

func (s *Server) listSites(c echo.Context) error {
	items, err := s.b.ListSites()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, SiteList{Items: views(items, siteView)})
}

func (s *Server) getSite(c echo.Context) error {
	items, err := s.b.ListSites()
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.ID == c.Param("id") {
			return c.JSON(http.StatusOK, siteView(it))
		}
	}
	return notFound("site", c.Param("id"))
}

func (s *Server) createSite(c echo.Context) error {
	var sp SiteSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &sp, false); err != nil {
		return err
	}
	if sp.ResourceVersion != 0 {
		return invalid("resource_version", "must be absent on create; use PUT /v1/sites/{id} to update")
	}
	out, err := s.b.PutSite(c.Request().Context(), store.Site{Meta: store.Meta{ID: sp.ID}, Name: sp.Name,
		Description: sp.Description}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, siteView(out))
}

func (s *Server) updateSite(c echo.Context) error {
	var sp SiteSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &sp, false); err != nil {
		return err
	}
	if sp.ID != "" && sp.ID != c.Param("id") {
		return invalid("id", "does not match the path")
	}
	sp.ID = c.Param("id")
	if sp.ResourceVersion == 0 {
		return invalid("resource_version", "required on update")
	}
	out, err := s.b.PutSite(c.Request().Context(), store.Site{Meta: store.Meta{ID: sp.ID, ResourceVersion: sp.ResourceVersion},
		Name: sp.Name, Description: sp.Description}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, siteView(out))
}

func (s *Server) listRacks(c echo.Context) error {
	items, err := s.b.ListRacks()
	if err != nil {
		return err
	}
	out := []Rack{}
	site := c.QueryParam("site")
	for _, r := range items {
		if site == "" || r.Site == site {
			out = append(out, rackView(r))
		}
	}
	return c.JSON(http.StatusOK, RackList{Items: out})
}

func (s *Server) getRack(c echo.Context) error {
	items, err := s.b.ListRacks()
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.ID == c.Param("id") {
			return c.JSON(http.StatusOK, rackView(it))
		}
	}
	return notFound("rack", c.Param("id"))
}

func (s *Server) createRack(c echo.Context) error {
	var rs RackSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rs, false); err != nil {
		return err
	}
	if rs.ResourceVersion != 0 {
		return invalid("resource_version", "must be absent on create; use PUT /v1/racks/{id} to update")
	}
	out, err := s.b.PutRack(c.Request().Context(), store.Rack{Meta: store.Meta{ID: rs.ID}, Site: rs.Site,
		Name: rs.Name, Row: rs.Row, Units: rs.Units}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, rackView(out))
}

func (s *Server) updateRack(c echo.Context) error {
	var rs RackSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rs, false); err != nil {
		return err
	}
	if rs.ID != "" && rs.ID != c.Param("id") {
		return invalid("id", "does not match the path")
	}
	rs.ID = c.Param("id")
	if rs.ResourceVersion == 0 {
		return invalid("resource_version", "required on update")
	}
	out, err := s.b.PutRack(c.Request().Context(), store.Rack{Meta: store.Meta{ID: rs.ID, ResourceVersion: rs.ResourceVersion},
		Site: rs.Site, Name: rs.Name, Row: rs.Row, Units: rs.Units}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rackView(out))
}
