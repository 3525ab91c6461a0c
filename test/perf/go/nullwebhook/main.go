// nullwebhook: an admission webhook server that does nothing but allow, for the bench's floor figure.
//
// The bench (test/perf, --webhook-server null) registers the chart's webhook configurations against this server
// instead of mcad's, so that throughput with webhooks on measures what the API server's own admission costs with
// a webhook that does nothing: Go's net/http, one JSON decode and encode a call. HTTP/1.1 by default, as
// an installation's API server speaks to a webhook behind a Service (it offers only http/1.1 by ALPN then, so that
// calls spread over the Service's pods); --http2 offers HTTP/2 too, which the API server takes only for a webhook
// addressed by URL.
//
// Contract:
//   - POST to a path ending in "mutate": allowed, with a JSON patch that records request.userInfo.username in the
//     annotation workload.codeflare.dev/creator (as mcad's mutating webhook does, so the bench's check that
//     creates are reviewed holds in either creator mode). Any other POST path: allowed, nothing else.
//   - A body that is not JSON, or larger than 3 MiB: 400. Nothing is checked: the server serves the bench only and
//     listens where it is told (the bench: 127.0.0.1).
//   - GET /stats: {"requests": reviews answered, "connections": connections accepted}, as JSON.
//   - TLS from --cert and --key (PEM files); HTTP/2 offered by ALPN only with --http2.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

const creatorAnnotation = "workload.codeflare.dev/creator"

type admissionReview struct {
	Request struct {
		UID      string `json:"uid"`
		UserInfo struct {
			Username string `json:"username"`
		} `json:"userInfo"`
		Object struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"request"`
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// creatorPatch records user in the creator annotation, adding the annotations map when the object has none.
func creatorPatch(review *admissionReview) ([]byte, error) {
	user := review.Request.UserInfo.Username
	if review.Request.Object.Metadata.Annotations == nil {
		return json.Marshal([]patchOp{{"add", "/metadata/annotations", map[string]string{creatorAnnotation: user}}})
	}
	// JSON pointer escaping: "/" is "~1" inside a key.
	path := "/metadata/annotations/" + strings.ReplaceAll(creatorAnnotation, "/", "~1")
	return json.Marshal([]patchOp{{"add", path, user}})
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9443", "host:port to listen on")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM)")
	http2 := flag.Bool("http2", false, "offer HTTP/2 by ALPN (default: HTTP/1.1 only)")
	flag.Parse()

	var requests, connections atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{"requests": requests.Load(), "connections": connections.Load()})
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var review admissionReview
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 3<<20)).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		response := map[string]any{"uid": review.Request.UID, "allowed": true}
		if strings.HasSuffix(r.URL.Path, "mutate") {
			patch, err := creatorPatch(&review)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			response["patchType"] = "JSONPatch"
			response["patch"] = patch // []byte: base64 in JSON, as the API expects
		}
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
	})
	// A head that does not arrive within the API server's whole-call timeout (10 s in the chart) is dropped, so a
	// stalled client cannot hold a connection open forever; kept-alive connections are the client's to close.
	countNew := func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			connections.Add(1)
		}
	}
	server := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, ConnState: countNew}
	if !*http2 {
		// A non-nil, empty map: net/http then neither offers nor speaks HTTP/2.
		server.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	log.Fatal(server.ListenAndServeTLS(*cert, *key))
}
