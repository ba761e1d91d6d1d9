package wait

import "testing"

func TestScaleReadsTheEnvironmentAndDoublesUnderRace(t *testing.T) {
	for _, tc := range []struct {
		env  string
		race bool
		want float64
	}{
		{"", false, 1},
		{"", true, 2},
		{"3", false, 3},
		{"1.5", true, 3},
		{"0", false, 1},
		{"-2", false, 1},
		{"NaN", false, 1},
		{"fast", true, 2},
	} {
		if got := scale(tc.env, tc.race); got != tc.want {
			t.Errorf("scale(%q, race %v) = %g, want %g", tc.env, tc.race, got, tc.want)
		}
	}
}
