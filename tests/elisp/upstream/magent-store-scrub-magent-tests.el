;;; magent-store-scrub-magent-tests.el --- Scrubbed sessions read by upstream magent  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; `magent-store scrub' rewrites the sessions that hold secrets: a
;; schema-6 file stays one file in magent's own format, a schema-7
;; session gets a new snapshot, an empty log and its header.  Here a
;; tree with planted secrets (tests/leaky.py, built by the checkout's
;; Python) is scrubbed by the real command, then read by upstream
;; magent's own readers: the release's `magent-session-read-file' for
;; the schema-6 file, the schema-7 magent-session.el's for the store's
;; session (its reader and replay).  Each must read the session whole,
;; with every secret replaced by its [redacted:KIND] marker and none left.

;;; Code:

(require 'ert)
(require 'json)
(require 'subr-x)
(require 'magent-store-test-upstream)
(magent-store-test-upstream-load)
(require 'magent-store-program)

(defconst magent-store-scrub-magent-test--tests
  (expand-file-name "../.." (file-name-directory (or load-file-name buffer-file-name)))
  "The checkout's tests/ folder, where leaky.py builds sessions with secrets.")

(defconst magent-store-scrub-magent-test--release-functions
  (let (names)
    (mapatoms (lambda (symbol)
                (when (and (fboundp symbol)
                           (string-prefix-p "magent-session" (symbol-name symbol)))
                  (push symbol names))))
    names)
  "The release's session functions, to forget schema 7's after it.")

(defun magent-store-scrub-magent-test--release ()
  "Load the release's magent-session.el back, forgetting schema 7's own functions."
  (load (locate-library "magent-session.el" t) nil t t)
  (mapatoms (lambda (symbol)
              (when (and (fboundp symbol)
                         (string-prefix-p "magent-session" (symbol-name symbol))
                         (not (memq symbol magent-store-scrub-magent-test--release-functions)))
                (fmakunbound symbol)))))

(defun magent-store-scrub-magent-test--run (input program &rest args)
  "Run PROGRAM with ARGS, INPUT on its standard input; return (STATUS . OUTPUT)."
  (with-temp-buffer
    (let ((status (if input
                      (let ((coding-system-for-write 'utf-8))
                        (with-temp-buffer
                          (insert input)
                          (let ((out (generate-new-buffer " *scrub-out*")))
                            (unwind-protect
                                (cons (apply #'call-process-region (point-min) (point-max)
                                             program nil out nil args)
                                      (with-current-buffer out (buffer-string)))
                              (kill-buffer out)))))
                    (cons (apply #'call-process program nil t nil args) (buffer-string)))))
      status)))

(defun magent-store-scrub-magent-test--planted (root)
  "Make the sessions with planted secrets under ROOT; return the secrets and the spec."
  (let* ((program (car (magent-store-program)))
         (python (expand-file-name "python" (file-name-directory program)))
         (script (format "import json, sys
sys.path[:0] = [%S]
from pathlib import Path
import leaky
from magent_store import export
root = Path(%S)
leaky.seven(root, 'sixer')
export.Exporter(root, backup=False, sync=False).run()  # magent's own format, as its release reads it
# The journal is history magent validates event by event; the helper's events are not in
# magent's full shape, and what magent reads is the snapshot.
six = root / 'global' / 'sixer.json'
data = json.loads(six.read_text())
data['journal'] = []
six.write_text(json.dumps(data, ensure_ascii=False))
leaky.seven(root)
print(json.dumps({'secrets': list(leaky.PLANTED), 'spec': leaky.SPEC}))"
                         magent-store-scrub-magent-test--tests root))
         (result (magent-store-scrub-magent-test--run nil python "-c" script)))
    (should (equal (car result) 0))
    (json-parse-string (cdr result) :object-type 'alist :array-type 'list)))

(defun magent-store-scrub-magent-test--text (session)
  "Every string magent holds of SESSION: its metadata and its thread, as JSON."
  (concat (magent-json-encode (magent-session-metadata session))
          (magent-json-encode
           (magent-thread-snapshot-to-alist (magent-session-thread session)))))

(defun magent-store-scrub-magent-test--check (text secrets markers)
  "TEXT holds none of SECRETS and each of MARKERS."
  (dolist (secret secrets)
    (should-not (string-search secret text))
    (should-not (string-search (json-encode-string secret) text)))
  (dolist (marker markers)
    (should (string-search marker text))))

(defconst magent-store-scrub-magent-test--markers
  '("Your key: [redacted:aws-access-token] — ключ ✓\\n[redacted:private-key]\\nend"
    "deploy with [redacted:openai-api-key]"
    "use token [redacted:github-pat] to push, «[redacted:auth-source]»"
    "[redacted:jwt]" "HF_TOKEN=[redacted:huggingface-access-token]\\n"
    "see [redacted:ticket]")
  "What magent must read in place of the secrets tests/leaky.py plants.")

(ert-deftest magent-store-scrub-magent-reads-scrubbed-sessions ()
  "Upstream magent's readers read scrubbed sessions whole, secrets redacted."
  (let* ((tmp (file-truename (make-temp-file "magent-store-scrub-" t)))
         (root (expand-file-name "sessions" tmp))
         (planted (magent-store-scrub-magent-test--planted root))
         (secrets (alist-get 'secrets planted))
         (spec (json-encode (alist-get 'spec planted))))
    (unwind-protect
        (let ((scrub (magent-store-scrub-magent-test--run
                      spec (car (magent-store-program))
                      "scrub" "--no-backup" "--redact-spec" "-" root)))
          (should (equal (car scrub) 0))
          ;; magent's release reads its own format, scrubbed.
          (should (string-match-p "\"schema-version\":6"
                                  (with-temp-buffer
                                    (insert-file-contents (expand-file-name "global/sixer.json" root))
                                    (buffer-string))))
          (let ((read (magent-session-read-file
                       (expand-file-name "global/sixer.json" root))))
            (should read)
            (should (equal (plist-get read :id) "sixer"))
            (magent-store-scrub-magent-test--check
             (magent-store-scrub-magent-test--text (plist-get read :session))
             secrets magent-store-scrub-magent-test--markers))
          ;; Schema-7 magent reads the store's session, scrubbed.
          (magent-store-test-upstream-need magent-store-test-upstream-session7
                                           "the schema-7 magent-session.el"
                                           "set MAGENT_SESSION7")
          (unwind-protect
              (progn
                (load (expand-file-name "magent-session.el"
                                        magent-store-test-upstream-session7)
                      nil t t)
                ;; Its reader and replay (its full load also needs a ledger
                ;; function that is not public): header, log and snapshot.
                (let* ((read (magent-session--read-validated-data
                              (expand-file-name "global/leaky.json" root)))
                       (state (plist-get read :state))
                       (thread (magent-thread-replay (plist-get state :snapshot)
                                                     (plist-get state :events))))
                  (should (equal (plist-get read :id) "leaky"))
                  (should-not (plist-get state :events))
                  (magent-store-scrub-magent-test--check
                   (concat (magent-json-encode (plist-get read :data))
                           (magent-json-encode (magent-thread-snapshot-to-alist thread)))
                   secrets
                   magent-store-scrub-magent-test--markers)))
            (magent-store-scrub-magent-test--release)))
      (delete-directory tmp t))))

(provide 'magent-store-scrub-magent-tests)
;;; magent-store-scrub-magent-tests.el ends here
