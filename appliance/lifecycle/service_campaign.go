package lifecycle

import (
	"context"
	"fmt"

	"kiln/appliance/lifecycle/waves"
	"kiln/store"
)

// Campaigns as the REST API sees them (campaign.go; api/campaigns.go).

func (s *Service) PlanCampaign(spec CampaignSpec) (waves.Plan, error) { return s.c.PlanCampaign(spec) }
func (s *Service) CreateCampaign(ctx context.Context, spec CampaignSpec, w store.W) (store.Campaign, error) {
	return s.c.CreateCampaign(ctx, spec, w)
}
func (s *Service) StartCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error) {
	id, err := s.campaignID(ref)
	if err != nil {
		return store.Campaign{}, err
	}
	return s.c.StartCampaign(ctx, id, w)
}
func (s *Service) HaltCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error) {
	id, err := s.campaignID(ref)
	if err != nil {
		return store.Campaign{}, err
	}
	return s.c.HaltCampaign(ctx, id, w)
}
func (s *Service) ResumeCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error) {
	id, err := s.campaignID(ref)
	if err != nil {
		return store.Campaign{}, err
	}
	return s.c.ResumeCampaign(ctx, id, w)
}

// GetCampaign returns the campaign whose ID or name is ref.
func (s *Service) GetCampaign(ref string) (store.Campaign, error) {
	id, err := s.campaignID(ref)
	if err != nil {
		return store.Campaign{}, err
	}
	return s.c.st.GetCampaign(id)
}

// ListCampaigns returns every campaign, ordered by ID.
func (s *Service) ListCampaigns() ([]store.Campaign, error) { return s.c.st.ListCampaigns() }

// campaignID resolves a campaign ID or name.
func (s *Service) campaignID(ref string) (string, error) {
	if _, err := s.c.st.GetCampaign(ref); err == nil {
		return ref, nil
	}
	list, err := s.c.st.ListCampaigns()
	if err != nil {
		return "", err
	}
	for _, c := range list {
		if c.Name == ref {
			return c.ID, nil
		}
	}
	return "", fmt.Errorf("%w: campaign %q", store.ErrNotFound, ref)
}
