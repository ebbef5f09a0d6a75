;;; magent-store-scan.el --- List the secrets saved in past magent sessions  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; M-x magent-store-scan lists the secrets saved in past sessions: per
;; secret, the session (its title, or its id), the field that holds it,
;; its kind (aws-access-token, github-pat, private-key, ...) and a
;; fingerprint that is the same wherever the same secret is, within one
;; scan.  The secret itself is never shown, nor read into Emacs.  RET
;; shows the session at point as a read-only transcript; g scans again.
;; The header line counts the secrets and says that `magent-store scrub'
;; removes them.
;;
;; Like a search, a scan is a separate `magent-store scan --json'
;; process: Emacs returns at once and the list is drawn when it exits.
;; Your own patterns, `magent-store-redact-patterns' (kind and regular
;; expression, in Python's syntax), are looked for too.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'tabulated-list)
(require 'magent-store)
(require 'magent-store-search)

(defvar magent-store-redact-patterns)

(defvar-local magent-store-scan--root nil
  "The session root this buffer scanned.")

(defvar-local magent-store-scan--process nil
  "The scan process whose results this buffer waits for, or nil.")

(defvar-local magent-store-scan--status nil
  "What the header line says: scanning, the counts, or an error.")

;;;; Running a scan

(defun magent-store-scan--patterns ()
  "Return the --pattern arguments for `magent-store-redact-patterns', if it is set."
  (when (boundp 'magent-store-redact-patterns)
    (cl-loop for (kind . regexp) in magent-store-redact-patterns
             append (list "--pattern" (format "%s=%s" kind regexp)))))

(defun magent-store-scan--stop ()
  "Stop the scan this buffer waits for, without drawing or saying anything."
  (magent-store-program-stop (prog1 magent-store-scan--process
                               (setq magent-store-scan--process nil))))

(defun magent-store-scan--start ()
  "Start this buffer's scan process; draw the findings when it exits."
  (magent-store-scan--stop)
  ;; What this Emacs has not saved yet is scanned too: written first.
  (magent-store-flush-all)
  (let* ((results (current-buffer))
         (process
          (magent-store-program-run
           "magent-store-scan"
           ;; Its summary and errors share the output: the JSON is its own line.
           `("scan" "--json" ,magent-store-scan--root ,@(magent-store-scan--patterns))
           (lambda (process text status)
             (when (buffer-live-p results)
               (with-current-buffer results
                 ;; Only the buffer's latest scan is drawn.
                 (when (eq process magent-store-scan--process)
                   (setq magent-store-scan--process nil)
                   (magent-store-scan--draw text status))))))))
    (setq magent-store-scan--process process)
    (setq tabulated-list-entries nil)
    (tabulated-list-print)
    (magent-store-scan--header "scanning…")
    process))

(defun magent-store-scan--parse (text)
  "Return the JSON reply in TEXT (the scan's output) as an alist, or nil."
  (when (string-match "^{\"sessions\".*$" text)
    (json-parse-string (match-string 0 text)
                       :object-type 'alist :array-type 'list
                       :null-object nil :false-object nil)))

(defun magent-store-scan--draw (text status)
  "Show the findings of the scan output TEXT, which exited with STATUS."
  (let* ((reply (magent-store-scan--parse text))
         (sessions (alist-get 'sessions reply))
         (unreadable (alist-get 'unreadable reply))
         (secrets (apply #'+ (mapcar (lambda (s) (length (alist-get 'findings s))) sessions))))
    (setq tabulated-list-entries
          (cl-loop for session in sessions
                   append (cl-loop for finding in (alist-get 'findings session)
                                   collect (list (cons session finding)
                                                 (magent-store-scan--row session finding)))))
    (tabulated-list-print)
    (goto-char (point-min))
    (magent-store-scan--header
     (cond
      ((not reply)
       (string-trim
        (replace-regexp-in-string "^magent-store: \\(error: \\)?" ""
                                  (if (string-blank-p text)
                                      (format "scan failed (exit status %s)" status)
                                    text))))
      (t (concat
          (if (zerop secrets)
              "No secret found"
            (format "%d secret%s in %d session%s: `magent-store scrub %s' removes them (keeping a backup)"
                    secrets (if (= secrets 1) "" "s")
                    (length sessions) (if (= (length sessions) 1) "" "s")
                    (shell-quote-argument (abbreviate-file-name magent-store-scan--root))))
          (if unreadable
              (format "; %d session%s could not be read" (length unreadable)
                      (if (= (length unreadable) 1) "" "s"))
            "")))))
    (unless reply
      (message "magent-store-scan: %s" magent-store-scan--status))))

(defun magent-store-scan--header (status)
  "Say STATUS in the header line."
  (setq magent-store-scan--status status
        header-line-format (list " " (replace-regexp-in-string "%" "%%" status)))
  (force-mode-line-update))

;;;; The list

(defun magent-store-scan--row (session finding)
  "Return the columns of FINDING in SESSION."
  (vector (or (alist-get 'title session) (alist-get 'id session)
              (file-name-base (or (alist-get 'path session) "")))
          (or (alist-get 'where finding) "")
          (or (alist-get 'kind finding) "")
          (or (alist-get 'fingerprint finding) "")))

(defvar magent-store-scan-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "RET") #'magent-store-scan-open)
    (define-key map "n" #'next-line)
    (define-key map "p" #'previous-line)
    map)
  "Keys of `magent-store-scan-mode'.")

(define-derived-mode magent-store-scan-mode tabulated-list-mode "Session scan"
  "The secrets saved in past sessions, found by `magent-store-scan'.
\\<magent-store-scan-mode-map>\\[magent-store-scan-open] shows the session at point, \
\\[next-line] and \\[previous-line] move, \\[revert-buffer] scans again."
  (setq tabulated-list-format [("Session" 36 t) ("Field" 44 t) ("Kind" 26 t) ("Fingerprint" 0 t)])
  (setq tabulated-list-padding 1)
  ;; The header line says what was found; the column names head the list.
  (setq-local tabulated-list-use-header-line nil)
  (setq revert-buffer-function #'magent-store-scan--revert)
  (tabulated-list-init-header))

(defun magent-store-scan--revert (&rest _)
  "Scan this buffer's root again."
  (magent-store-scan--start))

;;;###autoload
(defun magent-store-scan (&optional root)
  "List the secrets saved in the sessions under ROOT, never showing one.
Each row names the session, the field, the kind of secret and its
fingerprint.  ROOT is the session root (default: the one
magent-store uses).
Returns the list's buffer at once; the list appears when the scan is done."
  (interactive)
  (let ((root (expand-file-name (or root (magent-store-session-root)))))
    (unless (file-directory-p root)
      (user-error "No session root at %s" root))
    (let ((buffer (get-buffer-create "*magent-store scan*")))
      (with-current-buffer buffer
        ;; The mode resets the buffer's variables: stop its scan first.
        (magent-store-scan--stop)
        (magent-store-scan-mode)
        (setq magent-store-scan--root root)
        (magent-store-scan--start))
      (when (called-interactively-p 'any)
        (pop-to-buffer buffer))
      buffer)))

(defvar magent-store-scrub--process nil
  "The running scrub, if any.")

(defconst magent-store-scrub-buffer "*magent-store scrub*"
  "Where the last scrub's report is kept.")

;;;###autoload
(defun magent-store-scrub (&optional root)
  "Rewrite the sessions under ROOT that hold secrets, each secret redacted.
Asks first; a backup of the originals is kept.  The sessions this Emacs
has open are flushed and closed first (streaming opens them again);
those another Emacs holds are left, and named.  Runs in a process of
its own: its summary is shown when it is done, its report kept in the
buffer `magent-store-scrub-buffer' (shown when a session was left).
ROOT is the session root (default: the one magent-store uses).  Return
the process."
  (interactive)
  (let ((root (expand-file-name (or root (magent-store-session-root)))))
    (unless (file-directory-p root)
      (user-error "No session root at %s" root))
    (when (process-live-p magent-store-scrub--process)
      (user-error "A scrub is still running"))
    (unless (yes-or-no-p (format "Redact every secret saved under %s (the originals are \
copied first)? " root))
      (user-error "Nothing scrubbed"))
    (magent-store-close-all)
    (message "Scrubbing the sessions under %s…" root)
    (setq magent-store-scrub--process
          (magent-store-program-run
           "magent-store-scrub" `("scrub" ,root ,@(magent-store-scan--patterns))
           #'magent-store-scrub--done))))

(defun magent-store-scrub--done (process text status)
  "Say how PROCESS, a scrub that printed TEXT, ended with STATUS."
  (when (eq process magent-store-scrub--process)
    (setq magent-store-scrub--process nil))
  (let* ((lines (split-string text "\n" t))
         (summary (cl-find-if (lambda (line) (string-match-p "sessions seen" line)) lines))
         (last (car (last lines))))
    (with-current-buffer (get-buffer-create magent-store-scrub-buffer)
      (let ((inhibit-read-only t))
        (erase-buffer)
        (insert text))
      (special-mode))
    (message "magent-store: %s"
             (or summary
                 (and last (replace-regexp-in-string "\\`magent-store: \\(?:error: \\)?" "" last))
                 (format "scrub ended with exit status %d" status)))
    (unless (eql status 0)
      (display-buffer magent-store-scrub-buffer))))

(defun magent-store-scan-open ()
  "Show the session of the secret at point as a read-only transcript.
The transcript is the session as saved: the secrets are in it."
  (interactive)
  (let ((entry (tabulated-list-get-id)))
    (unless entry
      (user-error "No secret on this line"))
    (let ((session (car entry)))
      (magent-store-search-view
       `((id . ,(alist-get 'id session))
         (header . ,(alist-get 'path session))
         (title . ,(alist-get 'title session))
         (scope-label . ,(or (alist-get 'scope session) ""))
         (schema . ,(alist-get 'schema session)))))))

(provide 'magent-store-scan)
;;; magent-store-scan.el ends here
