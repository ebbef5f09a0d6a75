;;; magent-store-redact-magent-tests.el --- Redaction through magent's own code  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A conversation run through upstream magent's real functions, with
;; `magent-store-mode' on and redaction on, carries fake credentials of
;; every kind tests/planted.py builds at run time: whole, split across
;; streamed chunks, inside a tool call's JSON input, with non-ASCII
;; around them.  The raw bytes of every file under the session root and
;; the backend's state directory hold no trace of any
;; (tests/plantcheck.py greps them); magent's item in memory is unchanged;
;; magent's own reader brings back the redacted text.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'auth-source)
(require 'magent-store-resume-tests)

(defconst magent-store-redact-magent-test--tests
  (expand-file-name ".." (file-name-directory
                          (directory-file-name
                           (file-name-directory (or load-file-name buffer-file-name)))))
  "The tests/ folder.")

(defun magent-store-redact-magent-test--python (&rest args)
  "Run tests/plantcheck.py with ARGS in the backend's Python; return its JSON output, read."
  (let ((python (expand-file-name "python" (file-name-directory magent-store-test-python)))
        (default-directory (file-name-as-directory magent-store-redact-magent-test--tests)))
    (with-temp-buffer
      (let ((coding-system-for-read 'utf-8))
        (should (eq 0 (apply #'call-process python nil '(t nil) nil "plantcheck.py" args))))
      (goto-char (point-min))
      (json-parse-buffer :object-type 'alist :array-type 'list))))

(defun magent-store-redact-magent-test--pieces (text)
  "Return TEXT cut in pieces of 5 characters: every secret in it split."
  (let (pieces)
    (while (> (length text) 5)
      (push (substring text 0 5) pieces)
      (setq text (substring text 5)))
    (nreverse (cons text pieces))))

(ert-deftest magent-store-redact-magent-planted-credentials-reach-no-file ()
  "No trace of a planted secret on disk; magent's memory unchanged; resume is redacted."
  (skip-unless (and (magent-store-test-upstream-available-p) magent-store-test-python))
  (let* ((plants (magent-store-redact-magent-test--python "plants"))
         (netrc (make-temp-file "magent-store-netrc-"))
         (literal (alist-get 'secret (cl-find "auth-source" plants :key (lambda (p) (alist-get 'kind p))
                                              :test #'equal)))
         (reply (mapconcat (lambda (p) (alist-get 'text p)) plants "\n"))
         (tool-input `(:command ,(concat "deploy --token " (alist-get 'text (nth 1 plants)))
                       :env (:AUTH ,(alist-get 'secret (nth 2 plants)))))
         (tool-output (alist-get 'text (nth 3 plants))))
    (unwind-protect
        (magent-store-resume-test--with-magent
          (let ((coding-system-for-write 'utf-8))
            (with-temp-file netrc
              (insert "machine db.example.test login admin password " literal "\n")))
          (let* ((auth-sources (list netrc))
                 (magent-store-redact t)
                 (magent-store-redact-auth-sources '((:host "db.example.test")))
                 (magent-store-redact-patterns '(("ticket" . "TICKET-\\d{6}")))
                 (id "20261201-220000-secrets")
                 (magent-session--current-scope 'global)
                 (session (magent-session-create :id id :metadata '((title . "Clés"))))
                 (thread (magent-session-thread-ledger session))
                 (turn (magent-thread-queue-turn
                        thread (concat "Use this: " (alist-get 'text (nth 4 plants)))))
                 (turn-id (magent-thread-turn-id turn))
                 assistant tool)
            (auth-source-forget-all-cached)
            (should (string-search literal (magent-store-redact-spec-json)))
            (magent-thread-start-turn thread turn-id)
            (setq assistant (magent-thread-start-item thread turn-id 'message :role 'assistant))
            (dolist (piece (magent-store-redact-magent-test--pieces reply))
              (magent-thread-append-item-content thread assistant piece)
              (magent-store-request-flush id)
              (accept-process-output nil 0.001))
            (magent-thread-complete-item thread assistant
                                         :content (magent-thread-item-content assistant))
            (setq tool (magent-thread-start-item thread turn-id 'tool :id "call-1" :call-id "call-1"
                                                 :name "shell" :input tool-input))
            (dolist (piece (magent-store-redact-magent-test--pieces tool-output))
              (magent-thread-append-item-content thread tool piece t))
            (magent-thread-complete-item thread tool :output tool-output)
            (magent-thread-complete-turn thread turn-id '(:input-tokens 12))
            (magent-session-save-for-session session 'global)
            ;; What magent holds is what it was given.
            (should (equal (magent-thread-item-content assistant) reply))
            (should (equal (magent-thread-item-output tool) tool-output))
            (magent-store-resume-test--restart)
            (should (equal (magent-store-redact-magent-test--python
                            "leaks" magent-session-directory
                            (expand-file-name "magent-store" (getenv "XDG_STATE_HOME")))
                           nil))
            ;; magent's own reader brings back the redacted text.
            (let* ((file (expand-file-name (concat "global/" id ".json") magent-session-directory))
                   (loaded (plist-get (magent-session-read-file file) :session))
                   (turns (magent-thread-turns (magent-session-thread-ledger loaded)))
                   (items (magent-thread-turn-items (car turns)))
                   (content (magent-thread-item-content (car items))))
              (should (string-search "[redacted:aws-access-token]" content))
              (should (string-search "[redacted:auth-source]" content))
              (should (string-search "[redacted:ticket]" content))
              (should (string-search "[redacted:" (magent-thread-item-output (cadr items))))
              (should (string-search "[redacted:" (format "%S" (magent-thread-item-input (cadr items)))))
              (dolist (plant plants)
                (should-not (string-search (alist-get 'secret plant) content))))))
      (delete-file netrc))))

(provide 'magent-store-redact-magent-tests)
;;; magent-store-redact-magent-tests.el ends here
