// Package httpboot serves everything a network-booting server fetches over
// HTTP after its first stage: the per-machine iPXE script, the in-RAM
// provisioning environment (kernel and initramfs), OS images from an on-disk
// catalog, and the iPXE binaries for UEFI HTTP boot.
//
// Routes (exact ServeMux patterns; GET also answers HEAD):
//
//	GET /ipxe/{mac}        per-machine iPXE script, text/plain, never cached (see Script)
//	GET /env/vmlinuz       Config.EnvDir/vmlinuz
//	GET /env/initramfs     Config.EnvDir/initramfs
//	GET /images/{name}     an image from the Catalog (Config.ImageDir)
//	PUT /images/{name}     upload (only with Config.AllowUpload); header X-Image-SHA256 required
//	GET /ipxe.efi  /snp.efi  /undionly.kpxe   embedded iPXE binaries (ipxedust)
//
// Each file's Content-Type comes from one table (MediaType): .efi is
// application/efi, .iso application/vnd.efi-iso and .img
// application/vnd.efi-img, the types UEFI HTTP boot firmware reads before
// the URL's extension; the script is text/plain, everything else
// application/octet-stream. No header is ever sent with an empty value.
//
// Files are served with Range (RFC 9110 §14), Content-Length, HEAD, and a
// strong ETag that is the SHA-256 of the content (computed once per file and
// cached by size and modification time). No boot path ever answers 3xx:
// firmware HTTP clients do not follow redirects, so the request path is
// cleaned here ("//x", "x/", "/a/../x") before Go's ServeMux, which would
// otherwise redirect, sees it.
//
// No route but the upload reads a request body, so a request that carries
// one (Content-Length above 0, or chunked) is answered 413 at once without
// reading it, and its connection closed: a client trickling a body holds
// nothing. Headers are bounded by Config.ReadHeaderTimeout and
// Config.MaxHeaderBytes.
//
// The package imports nothing of Kiln's: the machine state arrives through the
// Backend interface, which the appliance implements over the store.
//
// Metrics (on the registry passed to New):
//
//	kiln_httpboot_transfers_total{class,result}  responses finished; class ipxe|env|image|script, result ok|error
//	kiln_httpboot_sent_bytes_total{class}        body bytes written
//	kiln_httpboot_errors_total{class,reason}     not_found|bad_request|backend|unsafe_value|upload|aborted|held (env not served: HoldEnv)
//	kiln_httpboot_active_transfers               responses in progress (gauge)
//	kiln_httpboot_digest_seconds                 time spent computing SHA-256 ETags (histogram)
package httpboot
