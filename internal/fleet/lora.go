package fleet

import (
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// loraInfoName is vLLM's adapter gauge: one series whose labels list the
// adapters of the running and the waiting requests (comma-separated) and
// the engine's max_loras, and whose value is when it was set (Unix
// seconds): the series with the largest value is the current one.
const loraInfoName = "vllm:lora_requests_info"

// LoRAInfo is what an engine reports of its LoRA adapters.
type LoRAInfo struct {
	// Running are the adapters of the requests in the batch; Waiting those
	// of the requests queued.
	Running, Waiting []string
	// MaxLoRAs is the most adapters one batch may hold (vLLM's
	// --max-loras); 0 when not reported.
	MaxLoRAs int
}

// Active reports whether adapter has requests running there.
func (l *LoRAInfo) Active(adapter string) bool {
	return l != nil && slices.Contains(l.Running, adapter)
}

// IsAdapter reports whether model is one of the LoRA adapters the backend
// lists.
func (i *Info) IsAdapter(model string) bool {
	return i != nil && model != "" && slices.Contains(i.Adapters, model)
}

// adaptersOf returns the ids of list that name a parent other than
// themselves: the LoRA adapters.
func adaptersOf(list *modelList) []string {
	var out []string
	for _, d := range list.Data {
		if d.ID != "" && d.Parent != "" && d.Parent != d.ID && !slices.Contains(out, d.ID) {
			out = append(out, d.ID)
		}
	}
	return out
}

// loraInfo reads vllm:lora_requests_info: the latest series (largest
// value), nil when absent. Engines behind one server (data parallel) each
// have a series; the latest one is taken, as the gauge is documented.
func loraInfo(mf *dto.MetricFamily) *LoRAInfo {
	var (
		best   *dto.Metric
		bestAt float64
	)
	for _, m := range mf.GetMetric() {
		if v, ok := value(m); ok && (best == nil || v > bestAt) {
			best, bestAt = m, v
		}
	}
	if best == nil {
		return nil
	}
	l := &LoRAInfo{}
	for _, lp := range best.GetLabel() {
		switch lp.GetName() {
		case "running_lora_adapters":
			l.Running = splitAdapters(lp.GetValue())
		case "waiting_lora_adapters":
			l.Waiting = splitAdapters(lp.GetValue())
		case "max_lora":
			l.MaxLoRAs, _ = strconv.Atoi(lp.GetValue())
		}
	}
	return l
}

func splitAdapters(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}
